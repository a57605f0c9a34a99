"""Build a ready Engine from a checkpoint directory and backend settings: the one entry point that the
CLI, the Ray Serve replica and the benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_workers.backends.cpu import CPU_MODES
from neuron_workers.engine import Engine
from neuron_workers.errors import UserError
from neuron_workers.host_inputs import default_buckets
from neuron_workers.loader import DTYPES, load_model

DEFAULT_CPU_CONTEXT = 1024


@dataclass(frozen=True)
class WorkerConfig:
    model: str
    backend: str = "cpu"
    tp: int = 1
    max_context: int | None = None
    prefill_buckets: tuple[int, ...] | None = None
    dtype: str = "float32"
    cpu_mode: str = "eager"  # cpu backend: eager | export | inductor (see backends/cpu.py)
    artifacts: str | None = None  # compiled graphs (compile build --out); required by the neuron backend
    max_batch: int | None = None  # sequences decoded together (KV rows); None: 1, or what the artifacts hold
    threads: int | None = None  # torch host threads for this process; None leaves torch's default


def resolve_context(max_context: int | None, max_positions: int) -> int:
    ctx = max_context or min(max_positions, DEFAULT_CPU_CONTEXT)
    if not 1 < ctx <= max_positions:
        raise UserError(f"max_context must be in [2, {max_positions}] for this model, got {ctx}")
    return ctx


def check_config(cfg: WorkerConfig) -> None:
    if cfg.cpu_mode not in CPU_MODES:
        raise UserError(f"unknown cpu mode {cfg.cpu_mode!r}; use one of {', '.join(CPU_MODES)}")
    if cfg.dtype not in DTYPES:
        raise UserError(f"unknown dtype {cfg.dtype!r}; use one of {', '.join(DTYPES)}")
    if cfg.max_batch is not None and not 1 <= cfg.max_batch <= 256:
        raise UserError(f"max_batch must be in [1, 256], got {cfg.max_batch}", param="max_batch")
    if cfg.threads is not None and cfg.threads < 1:
        raise UserError(f"threads must be >= 1, got {cfg.threads}", param="threads")


def build_engine(cfg: WorkerConfig) -> Engine:
    check_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.artifacts:
        from neuron_workers.artifacts import load_engine_from_artifacts

        return load_engine_from_artifacts(cfg)
    if cfg.backend != "cpu":
        raise UserError(f"the {cfg.backend} backend runs compiled artifacts: pass --artifacts DIR "
                        f"(made by `python -m compile build --backend {cfg.backend}`)")
    model = load_model(cfg.model, DTYPES[cfg.dtype], with_weights=cfg.tp == 1)  # tp ranks load their own
    ctx = resolve_context(cfg.max_context, model.dims.max_position_embeddings)
    buckets = resolve_buckets(cfg.prefill_buckets, ctx)
    batch = cfg.max_batch or 1
    if cfg.tp > 1:
        from neuron_workers.backends.cpu_tp import TpCpuBackend

        backend = TpCpuBackend(cfg.model, model.dims, cfg.tp, ctx, buckets, DTYPES[cfg.dtype], cfg.cpu_mode, batch)
    else:
        from neuron_workers.backends.cpu import CpuBackend

        backend = CpuBackend(model.hf_lm, model.dims, ctx, buckets, DTYPES[cfg.dtype], cfg.cpu_mode, max_batch=batch)
    return Engine(model, backend)


def resolve_buckets(buckets: tuple[int, ...] | None, ctx: int) -> tuple[int, ...]:
    """The prefill buckets to build: the given ones (checked against the context) or the defaults."""
    if not buckets:
        return default_buckets(ctx)
    bad = [b for b in buckets if not 0 < b <= ctx]
    if bad:
        raise UserError(f"prefill buckets must be in [1, {ctx}] (the max context); got {bad}")
    return tuple(sorted(set(buckets)))
