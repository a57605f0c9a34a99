"""The NEFF cache key and the compiler work directory (`backends/neuron_compile`): the key serializes the HLO
deterministically and changes with the flags, NEURON_CC_FLAGS and the compiler libraries' versions; the work
directory keeps the newest runs of each graph."""

from __future__ import annotations

import os
import time

import pytest

from neuron_workers.backends.neuron import PHASE_FLAGS
from neuron_workers.backends.neuron_compile import KEEP_WORKDIRS, cache_key, compiler_version, prune_workdir
from neuron_workers.model.spec import DECODE, PREFILL


class Proto:
    """A protobuf message's `SerializeToString`: map fields in any order unless asked to be deterministic."""

    def __init__(self):
        self.calls = 0

    def SerializeToString(self, deterministic=False):  # noqa: N802
        self.calls += 1
        return b"hlo" if deterministic else b"hlo-%d" % self.calls


def test_the_key_is_deterministic_and_covers_flags_env_and_versions(monkeypatch):
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    hlo = Proto()
    a, b = cache_key("decode", hlo, "-O2", "neuronx-cc=1"), cache_key("decode", hlo, "-O2", "neuronx-cc=1")
    assert a == b
    assert cache_key("decode", hlo, "-O1", "neuronx-cc=1") != a
    assert cache_key("decode", hlo, "-O2", "neuronx-cc=2") != a
    monkeypatch.setenv("NEURON_CC_FLAGS", "--retry_failed_compilation")
    assert cache_key("decode", hlo, "-O2", "neuronx-cc=1") != a
    v = compiler_version()
    assert [p.split("=")[0] for p in v.split(";")] == ["neuronx-cc", "libneuronxla", "torch-neuronx",
                                                       "neuronx-distributed"]


def test_the_work_directory_keeps_the_newest_runs_per_graph(tmp_path):
    for tag in ("decode", "prefill_16"):
        for i in range(KEEP_WORKDIRS + 2):
            run = tmp_path / tag / f"run{i}"
            run.mkdir(parents=True)
            (run / "log-neuron-cc.txt").write_text("x")
            t = time.time() - 100 + i
            os.utime(run, (t, t))
    assert prune_workdir(tmp_path) == 4
    for tag in ("decode", "prefill_16"):
        assert sorted(p.name for p in (tmp_path / tag).iterdir()) == [f"run{i}" for i in (2, 3)]
    assert prune_workdir(tmp_path / "absent") == 0


def test_nxdi_flags_per_phase():
    """NxD Inference's flags where they apply: collective overlap and strided DMA everywhere, the HLO verified,
    pipelining tiles 2 for prefill-like graphs and 1 for decode-like ones, -O1 with the modular-flow threshold for
    prefill, -O2 for decode."""
    pre, dec = PHASE_FLAGS[PREFILL], PHASE_FLAGS[DECODE]
    for f in (pre, dec):
        assert "--enable-ccop-compute-overlap" in f and "--vectorize-strided-dma" in f and "--verify-hlo=true" in f
        assert "--model-type=transformer" in f and "--auto-cast=none" in f and "--target inf2" in f
    assert "-O1" in pre and "--modular-flow-mac-threshold=10" in pre and "--cc-pipeline-tiling-factor=2" in pre
    assert "-O2" in dec and "modular-flow" not in dec and "--cc-pipeline-tiling-factor=1" in dec


@pytest.mark.slow
def test_weight_layout_optimization_by_flag(tiny_dirs, tmp_path, monkeypatch, capsys):
    """GEMMA4_WEIGHT_LAYOUT=1 (against the double): `decode` has its weights marked and compiles through
    compile_wlo, the layout transformer is made from it and held by the model, every other graph's HLO is rewritten
    to its layout before it compiles; the served tokens equal the plain build's. Without the flag none of it."""
    import json

    from compile.__main__ import main as compile_main
    from neuron_workers.generate import main as generate_main

    from doubles import neuron_double
    from doubles import neuron_double_units as units

    d = tiny_dirs["gemma4-e4b-tiny"]
    args = ["--model", str(d), "--prompt-ids", "2,40,41,42,43,44,45", "--max-tokens", "6", "--ignore-eos", "--json"]
    tokens = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("GEMMA4_WEIGHT_LAYOUT", flag)
        out = tmp_path / f"wlo{flag}"
        with neuron_double.installed():
            assert compile_main(["build", "--model", str(d), "--max-context", "64", "--prefill-buckets", "32",
                                 "--batch", "1", "--prefill-chunk", "0", "--out", str(out)]) == 0
            calls = list(units.WLO)
            capsys.readouterr()
            assert generate_main(args + ["--backend", "neuron", "--artifacts", str(out)]) == 0
            tokens[flag] = json.loads(capsys.readouterr().out)["token_ids"]
        if flag == "0":
            assert calls == []
        else:
            assert calls[:3] == [("mark", "decode"), ("compile_wlo", "decode"), ("layout", calls[2][1])]
            assert sorted(k for op, k in calls[3:]) == ["decode_logits", "prefill_32"]
            assert all(op == "apply" for op, _ in calls[3:])
    assert tokens["1"] == tokens["0"] and len(tokens["0"]) == 6
