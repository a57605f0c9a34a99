"""Checkpoint loading for the real layouts, and bad input answered with one clear line and a non-zero exit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from neuron_workers.generate import main
from neuron_workers.model.checkpoint import read_checkpoint_info
from neuron_workers.model.loader import load_model


def copy_ckpt(src, tmp_path, name="ckpt"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def cli_error(capsys, *args) -> tuple[int, str]:
    rc = main(["--max-tokens", "4", *args])
    err = capsys.readouterr().err.strip()
    return rc, err


def test_text_only_layout_loads_same_weights(tiny_dirs, tmp_path):
    """gemma4_text (keys model.*) from the multimodal checkpoint gives the same model as gemma4
    (model.language_model.*)."""
    src = tiny_dirs["gemma4-e2b-tiny"]
    dst = copy_ckpt(src, tmp_path)
    cfg = json.loads((src / "config.json").read_text())["text_config"]
    cfg["model_type"] = "gemma4_text"
    (dst / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(src / "model.safetensors"))
    pre = "model.language_model."
    save_file({"model." + k[len(pre):]: v for k, v in sd.items() if k.startswith(pre)}, str(dst / "model.safetensors"))
    a, b = load_model(src), load_model(dst)
    assert b.info.prefix == "model." and a.info.prefix == pre
    for (ka, va), (kb, vb) in zip(a.hf_lm.state_dict().items(), b.hf_lm.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_ple_table_stays_on_disk(tiny_dirs):
    m = load_model(tiny_dirs["gemma4-e4b-tiny"])
    assert m.hf_lm.model.embed_tokens_per_layer is None
    assert not any("per_layer" in k and "embed_tokens" in k for k in m.hf_lm.state_dict())
    sd = load_file(str(tiny_dirs["gemma4-e4b-tiny"] / "model.safetensors"))
    table = sd["model.language_model.embed_tokens_per_layer.weight"]
    ids = torch.tensor([[3, 7, 500]])
    expected = (table[ids] * torch.tensor(8**0.5)).reshape(1, 3, 12, 8)
    assert torch.equal(m.ple.lookup(ids), expected)
    assert m.ple.path.name == "model.safetensors"
    assert m.hf_lm.lm_head.weight is m.hf_lm.model.embed_tokens.weight


def test_eos_ids_from_generation_config(tiny_dirs):
    assert read_checkpoint_info(tiny_dirs["gemma4-12b-tiny"]).eos_token_ids == (1, 106, 50)


def test_missing_directory(capsys):
    rc, err = cli_error(capsys, "--model", "/nonexistent/x", "--prompt-ids", "2,3")
    assert rc == 2 and err == "error: model directory not found: /nonexistent/x"


def test_missing_weights(tiny_dirs, tmp_path, capsys):
    d = copy_ckpt(tiny_dirs["gemma4-e2b-tiny"], tmp_path)
    (d / "model.safetensors").unlink()
    rc, err = cli_error(capsys, "--model", str(d), "--prompt-ids", "2,3")
    assert rc == 2 and "no *.safetensors weights" in err and "\n" not in err


@pytest.mark.parametrize("change", ["drop", "extra", "shape", "renamed"])
def test_mismatched_weights(tiny_dirs, tmp_path, capsys, change):
    d = copy_ckpt(tiny_dirs["gemma4-e4b-tiny"], tmp_path)
    sd = load_file(str(d / "model.safetensors"))
    key = "model.language_model.layers.1.mlp.up_proj.weight"
    if change == "drop":
        del sd[key]
    elif change == "extra":
        sd["model.language_model.layers.1.mlp.extra.weight"] = torch.zeros(2)
    elif change == "shape":
        sd[key] = torch.zeros(3, 3)
    else:  # the text-only-class trap: keys that do not sit where the config says
        sd = {k.replace("model.language_model.", "language_model.model."): v for k, v in sd.items()}
    save_file(sd, str(d / "model.safetensors"))
    rc, err = cli_error(capsys, "--model", str(d), "--prompt-ids", "2,3")
    assert rc == 2 and err.startswith("error: ") and "\n" not in err
    want = {"drop": "1 missing", "extra": "1 unexpected", "shape": "has shape (3, 3)", "renamed": "missing"}
    assert want[change] in err


def test_unknown_model_type(tiny_dirs, tmp_path, capsys):
    d = copy_ckpt(tiny_dirs["gemma4-e2b-tiny"], tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    rc, err = cli_error(capsys, "--model", str(d), "--prompt-ids", "2,3")
    assert rc == 2 and "unsupported model_type 'llama'" in err


def test_prompt_over_context(tiny_dirs, capsys):
    ids = ",".join(["5"] * 70)
    rc, err = cli_error(capsys, "--model", str(tiny_dirs["gemma4-e2b-tiny"]), "--prompt-ids", ids,
                        "--max-context", "64")
    assert rc == 2 and "context is 64 tokens; the prompt has 70" in err


def test_text_prompt_without_tokenizer_and_ids_work(tiny_dirs, tmp_path, capsys):
    d = copy_ckpt(tiny_dirs["gemma4-12b-tiny"], tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (d / f).unlink()
    rc, err = cli_error(capsys, "--model", str(d), "--prompt", "hi")
    assert rc == 2 and "has no tokenizer" in err
    assert main(["--model", str(d), "--prompt-ids", "2,5,6", "--max-tokens", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 5 and out["text"] is None


def test_cli_process_prints_one_line(tmp_path):
    """The real process: exit code 2 and a single stderr line, no traceback."""
    p = subprocess.run([sys.executable, "-m", "neuron_workers.generate", "--model", str(tmp_path / "nope"),
                        "--prompt-ids", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: model directory not found: {tmp_path / 'nope'}"]


def test_bad_prompt_ids_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", "x", "--prompt-ids", "a,b"])
    assert e.value.code == 2 and "comma-separated integers" in capsys.readouterr().err


def test_penalty_flags(tiny_dirs, capsys):
    """--logit-bias forces a token; a bad flag or value is one `error:` line (exit 2), an id past the vocabulary
    too."""
    model = str(tiny_dirs["gemma4-e2b-tiny"])
    assert main(["--model", model, "--prompt-ids", "2,5,6", "--max-tokens", "4", "--json", "--ignore-eos",
                 "--logit-bias", "77=100", "--repetition-penalty", "1.3", "--frequency-penalty", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == [77] * 4
    rc, err = cli_error(capsys, "--model", model, "--prompt-ids", "2", "--presence-penalty", "3")
    assert rc == 2 and err == "error: presence_penalty must be a number in [-2, 2], got 3.0"
    rc, err = cli_error(capsys, "--model", model, "--prompt-ids", "2", "--logit-bias", "600=1")
    assert rc == 2 and err == "error: logit_bias keys must be token ids in [0, 512); got [600]"
    with pytest.raises(SystemExit) as e:
        main(["--model", model, "--prompt-ids", "2", "--logit-bias", "77"])
    assert e.value.code == 2 and "must be TOKEN_ID=BIAS" in capsys.readouterr().err
