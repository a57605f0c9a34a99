"""Serving from artifacts: read the manifest, refuse a mismatch (config, shapes, versions) with a message
naming it, and build the backend the artifacts were made for (with the loaded model it serves), its
`extend_buckets` the T of the extend graphs built (`manifest.serving_chunk`: none for artifacts built before
them; a `prefill_chunk` asked for must be one of them); speculative decoding needs its verify graph, and an MTP
drafter (`draft_model`) the draft graph of that drafter (`manifest.check_drafter`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from neuron_workers.artifacts.manifest import Manifest, check_drafter, serving_chunk
from neuron_workers.config import speculative_tokens
from neuron_workers.errors import UserError
from neuron_workers.model.loader import DTYPES, LoadedModel, load_model


def load_from_artifacts(cfg) -> tuple[LoadedModel, object]:
    manifest = Manifest.read(cfg.artifacts)
    if manifest.backend != cfg.backend:
        raise UserError(f"artifacts in {cfg.artifacts} were built for the {manifest.backend} backend, "
                        f"not {cfg.backend}", param="backend")
    loaded = load_model(cfg.model, DTYPES[manifest.dtype], with_weights=manifest.backend == "cpu")
    manifest.check(loaded.info.text_config, tp=cfg.tp, max_context=cfg.max_context, max_batch=cfg.max_batch,
                   prefill_buckets=list(cfg.prefill_buckets) if cfg.prefill_buckets else None)
    chunks = serving_chunk(manifest, cfg.prefill_chunk, loaded.dims.ring_size(manifest.max_context))
    if manifest.media_ids:  # the build's prefill / extend graphs take mm_embeds (`factory` loads the encoders)
        loaded.dims = dataclasses.replace(loaded.dims, media_ids=tuple(manifest.media_ids))
    if cfg.draft_model:  # before the device loads: a drafter the artifacts lack is refused at once
        from neuron_workers.model.assistant import read_assistant_info

        check_drafter(manifest, read_assistant_info(cfg.draft_model))
    art = Path(cfg.artifacts)
    if manifest.backend == "cpu":
        import torch

        from neuron_workers.backends.cpu import CpuBackend

        programs = {tag: torch.export.load(str(art / f)).module() for tag, f in manifest.graphs.items()}
        backend = CpuBackend(loaded.hf_lm, loaded.dims, manifest.max_context, tuple(manifest.prefill_buckets),
                             DTYPES[manifest.dtype], programs=programs, max_batch=manifest.max_batch)
    else:
        from neuron_workers.backends.neuron import NeuronBackend
        from neuron_workers.parallel.shard_plan import plan_for

        plan = plan_for(loaded.info.text_config, manifest.tp)
        backend = NeuronBackend(art, loaded.dims, manifest, plan.kv_heads if manifest.tp > 1 else None)
    backend.extend_buckets = chunks
    check_verify(manifest, speculative_tokens(cfg))
    return loaded, backend


def check_verify(manifest: Manifest, k: int) -> None:
    """Speculative decoding with k drafts needs the verify graph the build traced for it."""
    if k and [manifest.max_batch, k + 1, "all"] not in [list(s) for s in manifest.extend_graphs]:
        raise UserError(f"the artifacts have no verify graph for num_speculative_tokens {k} (extend_"
                        f"{manifest.max_batch}x{k + 1}_all): rebuild with `compile build --num-speculative-tokens "
                        f"{k}` or turn speculative decoding off", param="num_speculative_tokens")
