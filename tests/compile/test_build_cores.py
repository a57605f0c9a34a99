"""compile build pins the NeuronCores it may use (NEURON_RT_VISIBLE_CORES) before the runtime starts, for
the build's duration: building creates runtime models, and an unpinned process takes every visible core,
next to a running server's."""

from __future__ import annotations

import os

import pytest

from compile.__main__ import main as compile_main
from compile.build import pinned_cores
from neuron_workers.errors import UserError

VAR = "NEURON_RT_VISIBLE_CORES"


def test_default_is_the_first_tp_cores_and_the_variable_comes_back(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    said = []
    with pinned_cores(2, None, said.append) as cores:
        assert cores == "0-1" and os.environ[VAR] == "0-1" and "--cores" in said[0]
    assert VAR not in os.environ
    monkeypatch.setenv(VAR, "6")
    with pinned_cores(1, None, said.append) as cores:
        assert cores == "6"  # a pin the caller made stands
    with pinned_cores(2, "2,3", said.append):
        assert os.environ[VAR] == "2,3"
    assert os.environ[VAR] == "6"


@pytest.mark.parametrize("cores,match", [("4", "needs 2 NeuronCores"), ("a-b", "NeuronCore ids"),
                                         ("-1", "NeuronCore ids")])
def test_bad_cores_are_refused(monkeypatch, cores, match):
    monkeypatch.delenv(VAR, raising=False)
    with pytest.raises(UserError, match=match):
        with pinned_cores(2, cores, print):
            pass


def test_cli_refuses_bad_cores_before_loading(tiny_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    rc = compile_main(["build", "--model", str(tiny_dirs["gemma4-e2b-tiny"]), "--tp", "2", "--cores", "3",
                       "--out", str(tmp_path / "o")])
    assert rc == 2 and "a tp=2 build needs 2 NeuronCores" in capsys.readouterr().err and VAR not in os.environ
