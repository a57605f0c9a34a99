"""Engine factories a ModelServer replica can be given (by import path in `ModelSpec.engine`)."""

from __future__ import annotations


def build_worker_engine(spec):
    """The real engine: checkpoint + backend from neuron_workers (imports torch; only inside replicas)."""
    from neuron_workers.worker import WorkerConfig, build_engine

    return build_engine(WorkerConfig(
        model=spec.path, backend=spec.backend, tp=spec.tp, max_context=spec.max_context,
        prefill_buckets=tuple(spec.prefill_buckets) if spec.prefill_buckets else None, dtype=spec.dtype,
        cpu_mode=spec.cpu_mode, artifacts=spec.artifacts, max_batch=spec.max_batch, threads=spec.threads))
