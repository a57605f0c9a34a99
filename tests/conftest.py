"""Shared fixtures: the tiny checkpoints (written once per session) and transformers' own models on them."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from neuron_workers.testing.tiny import TINY, ensure_tiny

# one torch thread a worker when pytest-xdist runs two (the README's test command), two otherwise
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`) the tests that start Ray clusters and servers (tests/serve)
    run on one worker, one at a time, as without it (they share the session's cluster and bind ports); the
    rest spread over both workers. They are collected first, so that their worker starts them at once: they
    take the longest (mostly waiting on servers, about 9 minutes) while the other worker runs the CPU-bound
    tests, which it then shares."""
    serve = {id(item) for item in items if "serve" in item.path.relative_to(Path(__file__).parent).parts[:1]}
    for item in items:
        if id(item) in serve:
            item.add_marker(pytest.mark.xdist_group("serve"))
    items.sort(key=lambda item: id(item) not in serve)  # stable: each part keeps its order

NAMES = tuple(TINY)
CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "model-configs"


def real_config(size: str):
    import transformers as tf

    d = json.loads((CONFIGS / f"gemma-4-{size}.text_config.json").read_text())
    cls = tf.Gemma4UnifiedTextConfig if d.pop("model_type") == "gemma4_unified_text" else tf.Gemma4TextConfig
    return cls(**d)


def meta_shapes(cfg) -> dict[str, tuple[int, ...]]:
    import transformers as tf

    cls = tf.Gemma4UnifiedForCausalLM if cfg.model_type == "gemma4_unified_text" else tf.Gemma4ForCausalLM
    with torch.device("meta"):
        model = cls(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if "embed_tokens_per_layer" not in k}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    return ensure_tiny(tmp_path_factory.mktemp("tiny"))


def hf_reference(model_dir, dtype=torch.float32):
    """transformers' multimodal class loading the checkpoint itself: the independent reference."""
    import transformers as tf

    from neuron_workers.model.checkpoint import read_checkpoint_info

    cls = {"gemma4": tf.Gemma4ForConditionalGeneration,
           "gemma4_unified": tf.Gemma4UnifiedForConditionalGeneration}[read_checkpoint_info(model_dir).model_type]
    model = cls.from_pretrained(str(model_dir), attn_implementation="eager", dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    return out[0, len(ids):].tolist()


PORTS = range(20000, 32000)  # above Ray's worker ports (10002-19999), below Linux's ephemeral range (32768-60999)


def free_port() -> int:
    """A port nothing listens on now, chosen at random outside the ephemeral range: a port the kernel hands out
    (bind to 0) can be taken by any outgoing connection of Ray's processes before the test's server binds it
    (HAProxy's stats port was, once in a loop of serve runs); these are only taken by an explicit bind."""
    import random
    import socket

    for _ in range(200):
        port = random.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {PORTS}")


@pytest.fixture(scope="session")
def serve_url():
    """A light local Ray cluster with 4 fake NeuronCores and Serve's HTTP ingress on a free port, with the
    settings `python -m serve_app.run` gives a cluster (HAProxy in front: serve_app/ops/ray_env.py)."""
    from serve_app.ops.ray_env import apply_cluster_env

    apply_cluster_env()
    os.environ.setdefault("RAY_SERVE_HAPROXY_STATS_PORT", str(free_port()))  # apart from any other Serve here
    os.environ.setdefault("RAY_SERVE_HAPROXY_METRICS_PORT", str(free_port()))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_TMPDIR", "/tmp/g4ray")
    tests = str(Path(__file__).resolve().parent)  # replicas import test doubles (doubles.fake_engine) from here
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    import ray
    from ray import serve

    port, metrics_port = free_port(), free_port()
    ray.init(num_cpus=4, resources={"neuron_cores": 4}, include_dashboard=False,
             object_store_memory=100 * 1024**2, log_to_driver=False, _metrics_export_port=metrics_port)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    os.environ["GEMMA4_TEST_METRICS_URL"] = f"http://127.0.0.1:{metrics_port}/metrics"
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def deploy(app_args: dict, name: str, base: str) -> str:
    """serve.run one app under /<name>; returns its base URL (…/<name>/v1)."""
    from ray import serve

    from serve_app.app import build_app
    from serve_app.config import AppArgs

    serve.run(build_app(AppArgs(**app_args)), name=name, route_prefix=f"/{name}")
    return f"{base}/{name}/v1"


def inf2_config_copy(tmp_path, edit=None):
    """configs/inf2.yaml with each model's checkpoint directory replaced by one holding its real config."""
    import yaml

    root = tmp_path / "proj"
    (root / "configs").mkdir(parents=True)
    doc = yaml.safe_load((CONFIGS.parent / "inf2.yaml").read_text())
    sizes = {"gemma-4-e2b": "E2B", "gemma-4-e4b": "E4B", "gemma-4-12b": "12B"}
    for m in doc["applications"][0]["args"]["models"]:
        d = root / "models" / m["name"]
        d.mkdir(parents=True)
        (d / "config.json").write_text((CONFIGS / f"gemma-4-{sizes[m['name']]}.text_config.json").read_text())
        m["path"] = str(d)
        if edit:
            edit(m)
    path = root / "configs" / "inf2.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, doc
