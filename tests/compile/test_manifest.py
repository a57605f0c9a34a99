"""The manifest refuses artifacts that lack a graph this version runs (e.g. built before the top-K decode
graph, when `decode` meant the full logits) instead of loading them and failing every request."""

from __future__ import annotations

import pytest

from neuron_workers.artifacts.manifest import FORMAT, Manifest, config_hash
from neuron_workers.errors import UserError

from conftest import real_config


def manifest(graphs: dict, fmt: int = FORMAT) -> Manifest:
    cfg = real_config("E2B")
    return Manifest("cpu", config_hash(cfg), "gemma4_text", 1, 2, 64, [16, 32], "float32", {}, {}, graphs, fmt), cfg


def test_a_complete_manifest_passes():
    m, cfg = manifest({"prefill_16": "a", "prefill_32": "b", "decode": "c", "decode_logits": "d"})
    m.check(cfg, versions={})


@pytest.mark.parametrize("graphs,fmt,message", [
    ({"prefill_16": "a", "prefill_32": "b", "decode": "c"}, FORMAT, "decode_logits"),
    ({"prefill_16": "a", "decode": "c", "decode_logits": "d"}, FORMAT, "prefill_32"),
    ({"prefill_16": "a", "prefill_32": "b", "decode": "c"}, 2, "format 2"),
])
def test_missing_graphs_or_an_old_format_are_refused(graphs, fmt, message):
    m, cfg = manifest(graphs, fmt)
    with pytest.raises(UserError, match=message):
        m.check(cfg, versions={})
