"""The CLI's greedy tokens equal transformers' generate(do_sample=False) on the same checkpoint (fp32, eager),
for 96 new tokens, from prompts shorter than the window (8), longer than it, and of non-bucket lengths."""

from __future__ import annotations

import json

import pytest

from neuron_workers.generate import main

from conftest import NAMES, hf_greedy, hf_reference

pytestmark = pytest.mark.slow  # loads models or starts a Ray cluster


PROMPTS = {"short": [2, 17, 9, 33, 5], "past_window": list(range(40, 53)), "past_bucket": list(range(7, 7 + 37))}


def cli_tokens(capsys, model_dir, *extra) -> dict:
    assert main(["--model", str(model_dir), "--max-tokens", "96", "--ignore-eos", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", NAMES)
def test_cli_greedy_matches_transformers(name, tiny_dirs, capsys):
    ref = hf_reference(tiny_dirs[name])
    for label, ids in PROMPTS.items():
        out = cli_tokens(capsys, tiny_dirs[name], "--prompt-ids", ",".join(map(str, ids)))
        assert len(out["token_ids"]) == 96
        assert out["token_ids"] == hf_greedy(ref, ids, 96), f"{name} / {label}"


def test_text_prompt_and_text_output(tiny_dirs, capsys):
    from transformers import AutoTokenizer

    d = tiny_dirs["gemma4-e4b-tiny"]
    tok = AutoTokenizer.from_pretrained(str(d))
    out = cli_tokens(capsys, d, "--prompt", "Hello, what is the capital of France?")
    ids = tok("Hello, what is the capital of France?")["input_ids"]
    assert out["prompt_ids"] == ids
    assert out["token_ids"] == hf_greedy(hf_reference(d), ids, 96)
    assert out["text"] == tok.decode(out["token_ids"], skip_special_tokens=True)


def test_chat_prompt_uses_gemma4_turns(tiny_dirs, capsys):
    from transformers import AutoTokenizer

    d = tiny_dirs["gemma4-e2b-tiny"]
    out = cli_tokens(capsys, d, "--prompt", "Hello", "--chat")
    text = AutoTokenizer.from_pretrained(str(d)).decode(out["prompt_ids"])
    assert text == "<bos><|turn>user\nHello<turn|>\n<|turn>model\n"
