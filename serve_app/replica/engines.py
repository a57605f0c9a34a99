"""Engine factories a ModelServer replica can be given (by import path in `ModelSpec.engine`)."""

from __future__ import annotations

import threading


def build_worker_engine(spec):
    """The real engine: checkpoint + backend from neuron_workers (imports torch; only inside a replica's
    engine process, `serve_app/replica/engine_child.py`). The grammar tokenizer (about 1 s at 262,144 tokens) is
    built in the background, so the first constrained request does not wait for it."""
    from neuron_workers.factory import build_engine

    engine = build_engine(spec.engine_config())
    if engine.tokenizer is not None:
        threading.Thread(target=engine.grammars.tokenizer, name="grammar-tokenizer", daemon=True).start()
    return engine
