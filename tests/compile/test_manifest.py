"""The manifest refuses artifacts that lack a graph this version runs (e.g. built before the top-K decode
graph, when `decode` meant the full logits) instead of loading them and failing every request; one written
before extend graphs reads as one with none, and a `prefill_chunk` asked for must be among those built; an MTP
drafter served from artifacts must be the one they were built with."""

from __future__ import annotations

import json

import pytest

from neuron_workers.artifacts.manifest import FORMAT, Manifest, check_drafter, config_hash, drafter_facts, serving_chunk
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


def test_a_manifest_written_before_extend_graphs_reads_as_one_with_none(tmp_path):
    m, cfg = manifest({"prefill_16": "a", "prefill_32": "b", "decode": "c", "decode_logits": "d"})
    m.write(tmp_path)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    del raw["extend_graphs"], raw["extend_buckets"]
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    old = Manifest.read(tmp_path)
    old.check(cfg, versions={})
    assert old.extend_graphs == [] and old.extend_buckets == []
    assert serving_chunk(old, None, 16) == () and serving_chunk(old, 0, 16) == ()
    with pytest.raises(UserError, match="prefill_chunk none, this request asks for 16") as e:
        serving_chunk(old, 16, 16)
    assert e.value.param == "prefill_chunk"


def test_serving_chunk_keeps_the_built_extend_buckets_and_refuses_a_chunk_not_built():
    m, _ = manifest({})
    m.extend_graphs, m.extend_buckets = [[1, 16, "last"], [1, 16, "logits"]], [16]
    assert serving_chunk(m, None, 16) == (16,)  # the artifacts decide
    assert serving_chunk(m, 0, 16) == (16,)  # chunking off: the engine decides what it runs them for
    assert serving_chunk(m, 16, 16) == (16,)
    assert serving_chunk(m, 256, 16) == (16,)  # clamped to the ring, as resolve_prefill_chunk clamps it
    with pytest.raises(UserError, match=r"built with extend graphs for prefill_chunk \[16\], this request asks "
                                        r"for 8: rebuild with `compile build --prefill-chunk 8`"):
        serving_chunk(m, 8, 16)


def test_a_drafter_must_be_the_one_the_artifacts_were_built_with(tiny_dirs, tmp_path):
    from neuron_workers.model.assistant import read_assistant_info
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    info = read_assistant_info(write_tiny_assistant(tiny_dirs["gemma4-e2b-tiny"], tmp_path / "a", seed=1))
    m, cfg = manifest({"prefill_16": "a", "prefill_32": "b", "decode_h": "c", "decode_logits": "d"})
    with pytest.raises(UserError, match="built without an MTP drafter") as e:
        check_drafter(m, info)
    assert e.value.param == "draft_model"
    m.drafter = drafter_facts(info)
    check_drafter(m, info)
    with pytest.raises(UserError, match=r"lack the graphs \['draft'\]"):  # a drafter build has decode_h and draft
        m.check(cfg, versions={})
    m.graphs["draft"] = "e"
    m.check(cfg, versions={})
    m.drafter["num_centroids"] = 2048
    with pytest.raises(UserError, match="another drafter .*num_centroids 2048") as e:
        check_drafter(m, info)
    assert e.value.param == "draft_model"
