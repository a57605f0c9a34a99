"""Build a ready Engine from an EngineConfig: the one entry point that the CLI, the Ray Serve replica,
the smoke test and the benchmarks share. Picks the backend (in-process graphs: cpu, cpu over tp ranks,
xla; or compiled artifacts)."""

from __future__ import annotations

import torch

from neuron_workers.config import (
    EngineConfig,
    prefix_windows,
    resolve_context,
    resolve_extend_t,
    resolve_prefill_chunk,
    speculative_tokens,
)
from neuron_workers.engine.engine import Engine
from neuron_workers.engine.speculate import check_speculative_tokens
from neuron_workers.errors import UserError
from neuron_workers.model.host_inputs import default_buckets
from neuron_workers.model.loader import DTYPES, load_model


def build_engine(cfg: EngineConfig) -> Engine:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.artifacts:
        return _from_artifacts(cfg)
    if cfg.backend == "xla":
        from neuron_workers.backends.xla import require_xla

        require_xla()  # before loading: say what to install
        if cfg.tp != 1:
            raise UserError("the xla backend runs tp=1 (why not tp=2 on XLA CPU devices: docs/neuron.md, 'The xla "
                            "backend')", param="tp")
    model = load_model(cfg.model, DTYPES[cfg.dtype], with_weights=cfg.tp == 1)  # tp ranks load their own
    ctx = resolve_context(cfg.max_context, model.dims.max_position_embeddings)
    check_speculative_tokens(speculative_tokens(cfg), model.dims.ring_size(ctx), model.dims.sliding_window, ctx,
                             mtp=bool(cfg.draft_model))
    buckets = resolve_buckets(cfg.prefill_buckets, ctx)
    media = with_media(model)  # before the backend: the prefill / extend graphs then take `mm_embeds`
    if cfg.backend == "xla":
        from neuron_workers.backends.xla import XlaBackend

        backend = XlaBackend(model.hf_lm, model.dims, ctx, buckets, DTYPES[cfg.dtype], cfg.batch)
    elif cfg.tp > 1:
        from neuron_workers.backends.cpu_tp import TpCpuBackend

        backend = TpCpuBackend(cfg.model, model.dims, cfg.tp, ctx, buckets, DTYPES[cfg.dtype], cfg.cpu_mode,
                               cfg.batch)
    else:
        from neuron_workers.backends.cpu import CpuBackend

        backend = CpuBackend(model.hf_lm, model.dims, ctx, buckets, DTYPES[cfg.dtype], cfg.cpu_mode,
                             max_batch=cfg.batch)
    kind, ring = "tp" if cfg.tp > 1 else cfg.backend, model.dims.ring_size(ctx)
    chunk = resolve_prefill_chunk(cfg.prefill_chunk, kind, ring, ctx)
    extend_t = resolve_extend_t(chunk, kind, ring, ctx) if chunk or cfg.prefix_cache else 0
    backend.extend_buckets = (extend_t,) if extend_t else ()
    engine = Engine(model, backend, prefill_chunk=chunk, prefix_cache=cfg.prefix_cache, extend_t=extend_t,
                    speculative_tokens=speculative_tokens(cfg), prefix_windows=prefix_windows(cfg))
    engine.media = media
    if cfg.draft_model:
        attach_mtp(engine, cfg.draft_model, DTYPES[cfg.dtype])
    return engine


def with_media(model):
    """The checkpoint's `MediaSupport` (None: it takes no media); when there is one, `model.dims` names the media
    soft tokens, so the prefill and extend graphs take `mm_embeds` (cpu, tp and xla; Neuron artifacts say whether
    their build did, `artifacts.load`)."""
    import dataclasses

    from neuron_workers.media.support import load_media

    media = load_media(model.info, model.tokenizer, model.dtype)
    if media is not None:
        cfg = media.encoders.config
        model.dims = dataclasses.replace(model.dims, media_ids=(cfg.image_token_id, cfg.audio_token_id,
                                                                cfg.video_token_id))
    return media


def _from_artifacts(cfg: EngineConfig) -> Engine:
    """An engine over compiled artifacts; with `draft_model`, `load_from_artifacts` has checked that the build
    traced the draft graph for that drafter (neuron artifacts built with `compile build --draft-model`)."""
    from neuron_workers.artifacts.load import load_from_artifacts

    model, backend = load_from_artifacts(cfg)
    built = max(backend.extend_buckets, default=0)  # T of the extend graph the build traced, if any
    if cfg.draft_model:
        ctx = backend.max_context
        check_speculative_tokens(speculative_tokens(cfg), model.dims.ring_size(ctx), model.dims.sliding_window, ctx,
                                 mtp=True)
    kept = getattr(backend, "windows", 0)  # a neuron build's pool (`compile build --prefix-windows N`)
    windows = 0 if not cfg.prefix_cache else kept if cfg.prefix_windows is None else cfg.prefix_windows
    engine = Engine(model, backend, prefill_chunk=0 if cfg.prefill_chunk == 0 else built,
                    prefix_cache=cfg.prefix_cache, extend_t=built, speculative_tokens=speculative_tokens(cfg),
                    prefix_windows=windows)
    if model.dims.media_ids:  # the build traced mm_embeds (`Manifest.media_ids`): the encoders run on the host
        from neuron_workers.media.support import load_media

        engine.media = load_media(model.info, model.tokenizer, model.dtype)
    if cfg.draft_model:
        attach_mtp(engine, cfg.draft_model, backend.dtype)
    return engine


def attach_mtp(engine: Engine, draft_model: str, dtype: torch.dtype) -> None:
    """Load the `gemma4_assistant` (or, for a `gemma4_unified` target, `gemma4_unified_assistant`) checkpoint,
    check it fits the target, and make it the engine's drafter."""
    from neuron_workers.engine.mtp import MtpDrafter
    from neuron_workers.model.assistant import check_pairing, load_assistant, read_assistant_info

    check_pairing(read_assistant_info(draft_model), engine.dims, engine.model.info.model_type)
    assistant = load_assistant(draft_model, dtype)
    engine.backend.attach_drafter(assistant)
    engine.drafter = MtpDrafter(engine.backend, engine.dims.hidden_size, assistant.model.config.sliding_window)


def resolve_buckets(buckets: tuple[int, ...] | None, ctx: int) -> tuple[int, ...]:
    """The prefill buckets to build: the given ones (checked against the context) or the defaults."""
    if not buckets:
        return default_buckets(ctx)
    bad = [b for b in buckets if not 0 < b <= ctx]
    if bad:
        raise UserError(f"prefill buckets must be in [1, {ctx}] (the max context); got {bad}",
                        param="prefill_buckets")
    return tuple(sorted(set(buckets)))
