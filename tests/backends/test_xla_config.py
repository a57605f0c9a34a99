"""The xla backend as configured: in-process like cpu (no artifacts; the neuron backend still needs them), tp=1,
and without torch-xla one `error:` line saying what to install (the main environment has none)."""

from __future__ import annotations

import importlib.util

import pytest

from neuron_workers.config import EngineConfig
from neuron_workers.errors import UserError
from neuron_workers.generate import main as generate_main

NO_XLA = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None,
                            reason="checks the message shown without torch-xla, which is installed here")


def test_xla_needs_no_artifacts_and_neuron_still_does():
    assert EngineConfig(model="m", backend="xla").artifacts is None
    with pytest.raises(UserError, match="the neuron backend runs compiled artifacts") as e:
        EngineConfig(model="m", backend="neuron")
    assert e.value.param == "artifacts"


def test_xla_is_tp1(tiny_dirs, capsys):
    pytest.importorskip("torch_xla")
    rc = generate_main(["--model", str(tiny_dirs["gemma4-e2b-tiny"]), "--prompt-ids", "2,5", "--backend", "xla",
                        "--tp", "2"])
    assert rc == 2 and "the xla backend runs tp=1" in capsys.readouterr().err


@NO_XLA
def test_without_torch_xla_one_line_says_what_to_install(tiny_dirs, capsys):
    rc = generate_main(["--model", str(tiny_dirs["gemma4-e2b-tiny"]), "--prompt-ids", "2,5", "--backend", "xla"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "torch-xla==2.9.0" in err and err.startswith("error: ")
