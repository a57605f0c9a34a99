"""Engine factories a ModelServer replica can be given (by import path in `ModelSpec.engine`)."""

from __future__ import annotations


def build_worker_engine(spec):
    """The real engine: checkpoint + backend from neuron_workers (imports torch; only inside replicas)."""
    from neuron_workers.factory import build_engine

    return build_engine(spec.engine_config())
