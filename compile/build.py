"""`compile build`: one pipeline for every backend. Load the checkpoint, expand the prefill buckets and the decode
step (`decode_logits` with logits, `decode` with top-K candidates) into graphs, and for neuron the extend graphs
of chunked prefill (`extend_1xT`, `extend_1xT_logits`, T the resolved `prefill_chunk`: default 256, 0 or a model
whose sliding ring is smaller: none; beside them the mixed graphs `mixed_BxT` and `mixed_BxT_logits`, a chunk
beside every slot's decode token) and, with `num_speculative_tokens` K, the verify graph `extend_{B}x{K+1}_all`,
and with `draft_model` (an MTP drafter, neuron) the `_h` variants of the candidate graphs (`mixed_BxT_h` too) and
the `draft` graph (K defaults to 4 then, as serving that drafter does), hand them to the backend's
builder with per-graph progress, and write the manifest that serving checks (with the extend graphs and their T
as `extend_buckets`, and the drafter's facts). The cpu backend writes strict torch.export programs (.pt2) of the
prefill and decode graphs only (no drafter), so the whole pipeline (build -> manifest -> load -> generate) runs
and is tested without Neuron hardware."""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from neuron_workers.artifacts.manifest import Manifest, config_hash, drafter_facts, installed_versions
from neuron_workers.config import (
    EngineConfig,
    prefix_windows,
    resolve_context,
    resolve_prefill_chunk,
    speculative_tokens,
)
from neuron_workers.errors import UserError
from neuron_workers.factory import resolve_buckets
from neuron_workers.model.loader import DTYPES, load_model
from neuron_workers.model.spec import DECODE, PREFILL, decode_candidates, make_spec

CORES_VAR = "NEURON_RT_VISIBLE_CORES"


def build(cfg: EngineConfig, progress=print, jobs: int = 1, cores: str | None = None,
          resume_hint: str = "") -> Manifest:
    """Build `cfg.model` for `cfg.backend` into `cfg.artifacts` (batch: `cfg.batch`); a neuron build runs on
    the NeuronCores `cores` (default: NEURON_RT_VISIBLE_CORES if set, else the first tp). `resume_hint`: what
    a failed neuron build tells the user to run again (its compiled graphs are kept in the artifacts)."""
    if not cfg.artifacts:
        raise UserError("say where to write the artifacts (--out)", param="artifacts")
    with pinned_cores(cfg.tp, cores, progress) if cfg.backend == "neuron" else nullcontext():
        return _build(cfg, progress, jobs, resume_hint)


def _build(cfg: EngineConfig, progress, jobs: int, resume_hint: str = "") -> Manifest:
    backend, tp, batch, dtype = cfg.backend, cfg.tp, cfg.batch, cfg.dtype
    if backend == "neuron":
        from neuron_workers.backends.neuron import require_neuron

        require_neuron()  # before minutes of loading: say what to install
    out = Path(cfg.artifacts)
    if (out / "manifest.json").exists():
        raise UserError(f"{out} already holds artifacts: choose another --out or remove it")
    t0 = time.perf_counter()
    loaded = load_model(cfg.model, DTYPES[dtype])
    ctx = resolve_context(cfg.max_context, loaded.dims.max_position_embeddings)
    buckets = resolve_buckets(cfg.prefill_buckets, ctx)
    chunk = resolve_prefill_chunk(cfg.prefill_chunk, "neuron", loaded.dims.ring_size(ctx), ctx) \
        if backend == "neuron" else 0
    progress(f"loaded {cfg.model} ({loaded.info.model_type}, {loaded.dims.num_layers} layers) in "
             f"{time.perf_counter() - t0:.1f}s; graphs: prefill {list(buckets)} + decode"
             f"{f' + extend 1x{chunk} (prefill_chunk)' if chunk else ''}, context {ctx}, tp {tp}, batch {batch}")
    drafter = load_drafter(cfg, loaded, ctx, progress) if cfg.draft_model else None
    from neuron_workers.media.support import served_media_ids

    media_ids = served_media_ids(loaded.info) if backend == "neuron" else ()
    if media_ids:  # the prefill / extend graphs take the media embeddings too (`mm_embeds`)
        loaded.dims = dataclasses.replace(loaded.dims, media_ids=media_ids)
        progress(f"images / audio: the prefill and extend graphs take mm_embeds (soft tokens {list(media_ids)}); "
                 "the encoders run on the host (docs/media.md)")
    out.mkdir(parents=True, exist_ok=True)
    extend, windows = [], 0
    if backend == "cpu":
        graphs, flags = _build_cpu(loaded, tp, batch, ctx, buckets, out, progress), {}
    elif backend == "neuron":
        from neuron_workers.backends.neuron_build import build_neuron

        extend = extend_shapes(batch, chunk, speculative_tokens(cfg))
        windows = prefix_windows(cfg) if chunk or cfg.prefix_cache else 0
        flags = build_neuron(loaded, tp, batch, ctx, buckets, out, progress, jobs, resume_hint, extend, drafter,
                             windows)
        graphs = {tag: "nxd_model.pt" for tag in flags}
    else:
        raise UserError(f"compile build does not build for the {backend} backend", param="backend")
    manifest = Manifest(backend, config_hash(loaded.info.text_config), loaded.info.model_type, tp, batch, ctx,
                        list(buckets), dtype, flags, installed_versions(backend), graphs,
                        extend_graphs=[list(s) for s in extend], extend_buckets=[chunk] if chunk else [],
                        drafter=drafter_facts(drafter.info) if drafter is not None else {},
                        media_ids=list(media_ids), prefix_windows=windows)
    manifest.write(out)
    progress(f"wrote {out / 'manifest.json'} ({len(graphs)} graphs) in {time.perf_counter() - t0:.1f}s")
    return manifest


def extend_shapes(batch: int, chunk: int, k: int) -> list:
    """The extend graphs of a neuron build: the chunk's (`chunk` 0: none), the mixed graphs beside them (a chunk
    step runs them instead of a verify, with either drafter: beside an MTP drafter they are the `_h` variants,
    which return the hidden states its next round reads), and the verify graph of k drafts (0: none)."""
    from neuron_workers.backends.neuron import chunk_shapes, mixed_shapes, verify_shapes

    return chunk_shapes(chunk) + mixed_shapes(batch, chunk) + verify_shapes(batch, k)


def load_drafter(cfg: EngineConfig, loaded, ctx: int, progress):
    """The MTP drafter `cfg.draft_model` (a `gemma4_assistant` or `gemma4_unified_assistant` checkpoint), checked
    against the target and the build (neuron; at tp=2 its heads must split as the target's K/V do; k within the
    rings' slack), in the build's dtype."""
    from neuron_workers.engine.speculate import check_speculative_tokens
    from neuron_workers.model.assistant import check_pairing, load_assistant, read_assistant_info
    from neuron_workers.parallel.shard_plan import plan_for_assistant

    if cfg.backend != "neuron":
        raise UserError(f"a build with draft_model is a neuron build (asked: {cfg.backend}); the cpu backend runs "
                        "the drafter without artifacts", param="draft_model")
    info = read_assistant_info(cfg.draft_model)
    check_pairing(info, loaded.dims, loaded.info.model_type)
    plan_for_assistant(info.text_config, cfg.tp)  # a UserError when its heads do not split over tp ranks
    check_speculative_tokens(speculative_tokens(cfg), loaded.dims.ring_size(ctx), loaded.dims.sliding_window, ctx,
                             mtp=True)
    drafter = load_assistant(cfg.draft_model, loaded.dtype)
    progress(f"MTP drafter {cfg.draft_model}: draft graph + the _h candidate graphs, verify of "
             f"{speculative_tokens(cfg)} drafts")
    return drafter


def default_cores(tp: int, cores: str | None) -> str:
    """The NeuronCores a build uses: `cores`, else NEURON_RT_VISIBLE_CORES, else the first tp."""
    return cores or os.environ.get(CORES_VAR) or ("0" if tp == 1 else f"0-{tp - 1}")


@contextmanager
def pinned_cores(tp: int, cores: str | None, progress):
    """Pin this build to `cores` (NEURON_RT_VISIBLE_CORES, read when the runtime starts) for its duration:
    building creates runtime models (NxDModel.add), and an unpinned process takes every visible NeuronCore,
    next to a running server's. Yields the cores; the variable is restored afterwards."""
    cores = default_cores(tp, cores)
    try:
        ids = [i for part in cores.split(",") for a, _, b in [part.strip().partition("-")]
               for i in range(int(a), int(b or a) + 1)]
    except ValueError:
        raise UserError(f"--cores must be NeuronCore ids such as 0-1 or 2,3, got {cores!r}", param="cores") from None
    if len(ids) < tp:
        raise UserError(f"a tp={tp} build needs {tp} NeuronCores; --cores {cores!r} names {len(ids)}", param="cores")
    before = os.environ.get(CORES_VAR)
    os.environ[CORES_VAR] = cores
    progress(f"building on NeuronCores {cores} ({CORES_VAR}; --cores picks cores no server is using)")
    try:
        yield cores
    finally:
        if before is None:
            os.environ.pop(CORES_VAR, None)
        else:
            os.environ[CORES_VAR] = before


def _build_cpu(loaded, tp, batch, ctx, buckets, out: Path, progress) -> dict[str, str]:
    import torch

    from neuron_workers.backends.cpu import export_graph
    from neuron_workers.model.graphs import build_graph

    if tp != 1:
        raise UserError("cpu artifacts are single-rank: build with --tp 1 (the cpu backend runs tp=2 "
                        "directly: python -m neuron_workers.generate --tp 2)")
    specs = [make_spec(loaded.dims, PREFILL, batch, b, ctx, loaded.dtype) for b in buckets]
    specs.append(make_spec(loaded.dims, DECODE, batch, 1, ctx, loaded.dtype))
    specs.append(make_spec(loaded.dims, DECODE, batch, 1, ctx, loaded.dtype,
                           candidates=decode_candidates(loaded.dims)))
    graphs = {}
    for i, spec in enumerate(specs, 1):
        t = time.perf_counter()
        progress(f"[{i}/{len(specs)}] exporting {spec.tag} ...")
        program = export_graph(build_graph(loaded.hf_lm, loaded.dims, spec), spec)
        torch.export.save(program, str(out / f"{spec.tag}.pt2"))
        graphs[spec.tag] = f"{spec.tag}.pt2"
        progress(f"[{i}/{len(specs)}] {spec.tag} done in {time.perf_counter() - t:.1f}s")
    return graphs
