"""Fail fast, lose nothing (against the Neuron double): a neuron build compiles `decode` (the riskiest graph)
first and alone and stops with its compiler log when it fails; every compiled graph (extend graphs included) is
kept, so the retry compiles only what is missing, and the error says how to resume. `compile build --config`
builds each model in a process of its own, its cores pinned before it starts. `compile plan --config` works without the
checkpoints (the bundled real configs)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from compile.__main__ import main as compile_main
from compile.build_config import build_config
from neuron_workers.artifacts.manifest import Manifest
from neuron_workers.backends.neuron_compile import risk_order

from conftest import inf2_config_copy
from doubles import neuron_double
from doubles import neuron_double_units as units


def test_risk_order_puts_the_top_k_decode_first():
    assert risk_order(["prefill_16", "prefill_512", "decode_logits", "decode"]) == [
        "decode", "decode_logits", "prefill_512", "prefill_16"]


def test_risk_order_puts_the_extend_graphs_between_the_decodes_and_the_buckets():
    """Largest rows x T first (a mixed graph's rows: every slot), a shape's top-K variants before its `_logits`
    (tags as `spec.GraphSpec.tag`)."""
    tags = ["prefill_16", "extend_1x256_logits", "prefill_4096", "extend_32x8_all", "decode", "extend_1x256",
            "decode_logits", "mixed_32x256_logits", "mixed_32x256"]
    assert risk_order(tags) == ["decode", "decode_logits", "mixed_32x256", "mixed_32x256_logits", "extend_1x256",
                                "extend_32x8_all", "extend_1x256_logits", "prefill_4096", "prefill_16"]
    # a build with an MTP drafter: the `_h` variants rank as the plain ones
    with_drafter = ["prefill_16", "extend_1x256_logits", "draft", "extend_32x8_all_h", "decode_h", "extend_1x256_h",
                    "mixed_32x256_logits", "decode_logits", "mixed_32x256_h"]
    assert risk_order(with_drafter) == ["decode_h", "decode_logits", "draft", "mixed_32x256_h", "mixed_32x256_logits",
                                        "extend_1x256_h", "extend_32x8_all_h", "extend_1x256_logits", "prefill_16"]


@pytest.mark.slow
def test_a_failing_graph_stops_the_build_early_and_the_retry_resumes(tiny_dirs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "art"
    cmd = ["build", "--model", str(tiny_dirs["gemma4-e2b-tiny"]), "--max-context", "64", "--prefill-buckets",
           "16,32", "--batch", "2", "--prefill-chunk", "16", "--out", str(out)]
    with neuron_double.installed():
        monkeypatch.setattr(units, "FAIL_COMPILE", {"decode"})
        assert compile_main(cmd) == 2
        err = capsys.readouterr().err
        assert [t for t, _ in units.COMPILED] == ["decode"]  # nothing else was compiled
        assert "graph decode did not compile" in err and "ISGV902" in err and "log-neuron-cc.txt" in err
        assert f"run `python -m compile {' '.join(cmd)}` again" in err
        units.COMPILED.clear()
        monkeypatch.setattr(units, "FAIL_COMPILE", {"extend_1x16"})
        assert compile_main(cmd) == 2
        err = capsys.readouterr().err
        assert [t for t, _ in units.COMPILED][0] == "decode" and len(units.COMPILED) == 8  # every graph tried
        assert "graph extend_1x16 did not compile" in err and "7 compiled graphs are kept" in err
        units.COMPILED.clear()
        monkeypatch.setattr(units, "FAIL_COMPILE", set())
        assert compile_main(cmd) == 0
        said = capsys.readouterr().out
        assert [t for t, _ in units.COMPILED] == ["extend_1x16"]  # the seven kept graphs were reused
        assert said.count("compiled by an earlier run, reused") == 7
    m = Manifest.read(out)
    assert m.max_batch == 2 and m.extend_buckets == [16]


def test_config_builds_each_model_in_a_process_of_its_own(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    path, doc = inf2_config_copy(tmp_path, lambda m: m.update(artifacts=str(tmp_path / "art" / m["name"])))
    runs = []

    def run(cmd, env):
        runs.append((cmd[cmd.index("--model") + 1], env["NEURON_RT_VISIBLE_CORES"], cmd))
        return types.SimpleNamespace(returncode=3 if cmd[cmd.index("--model") + 1] == "gemma-4-e4b" else 0)

    assert build_config(str(path), None, 2, None, ["build", "--config", str(path)], run=run) == 3
    assert [(m, c) for m, c, _ in runs] == [("gemma-4-e2b", "0"), ("gemma-4-e4b", "0-1")]  # stops at the failure
    assert runs[0][2][1:] == ["-m", "compile", "build", "--config", str(path), "--model", "gemma-4-e2b",
                              "--jobs", "2"]
    err = capsys.readouterr().err
    assert "gemma-4-e4b failed (exit 3); built: ['gemma-4-e2b']; not started: ['gemma-4-12b']" in err
    assert f"run `python -m compile build --config {path}` again to resume" in err
    # the retry skips what was built (its manifest is there)
    (tmp_path / "art" / "gemma-4-e2b").mkdir(parents=True)
    (tmp_path / "art" / "gemma-4-e2b" / "manifest.json").write_text("{}")
    runs.clear()
    assert build_config(str(path), None, 1, "2-3", [], run=run) == 3
    assert [(m, c) for m, c, _ in runs] == [("gemma-4-e4b", "2-3")]
    assert "gemma-4-e2b: " in capsys.readouterr().out


def test_plan_from_the_config_without_checkpoints_uses_the_bundled_configs(tmp_path, capsys):
    path, _ = inf2_config_copy(tmp_path, lambda m: m.update(path=f"/nowhere/{Path(m['path']).name}-it"))
    # the copy names directories gemma-4-e2b etc.: no checkpoint there, the bundled real configs stand in
    assert compile_main(["plan", "--config", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    plans = [json.loads(line) for line in out.strip().splitlines()]
    assert [p["model_type"] for p in plans] == ["gemma4_text", "gemma4_text", "gemma4_unified_text"]
    assert err.count("planning with the bundled configs/model-configs/gemma-4-") == 3
    assert "no model config at /nowhere/gemma-4-e2b-it" in err


def test_plan_prefers_the_checkpoints_own_config(tmp_path, capsys):
    path, _ = inf2_config_copy(tmp_path)
    assert compile_main(["plan", "--config", str(path)]) == 0
    assert "bundled" not in capsys.readouterr().err
