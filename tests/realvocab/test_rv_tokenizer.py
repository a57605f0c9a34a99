"""The real Gemma-4 vocabulary (262,144 entries, from Gemma-3's tokenizer.json with the control tokens renamed):
control tokens are single special ids at their real ids, HTML tags are whole tokens, rare characters fall back
to bytes, and the engine's incremental detokenizer equals a full decode on all of it (and on random ids, what
random weights emit)."""

from __future__ import annotations

import random

import pytest
import rv_setup

from neuron_workers.engine.detokenizer import IncrementalDetokenizer, unused_ids
from neuron_workers.testing.real_vocab import CONTROL, VOCAB

pytestmark = rv_setup.MARKS
TEXTS = ['<div class="x"><p>Hi <b>there</b></p></div>', "if a < b and b > c: print(a<b)",
         "emoji 🫠🧑\u200d🚀 and rare 𓀀𝔘ꙮ\u2028 and ünïcödé", "x\x01y\tz\n\n  spaces ",
         '<|turn>model\n<|tool_call>call:f{q:<|"|>a < b<|"|>}<tool_call|><turn|>']


@pytest.fixture(scope="module")
def tok():
    return rv_setup.tokenizer()


def test_control_tokens_are_single_special_ids(tok):
    assert len(tok) == VOCAB
    for i, name in CONTROL.items():
        assert tok.convert_ids_to_tokens(i) == name
        assert tok.encode(name, add_special_tokens=False) == [i]
        assert tok.encode(f"x {name}y", add_special_tokens=False).count(i) == 1
        assert tok.decode([i], skip_special_tokens=True) == ""
    assert tok.encode("hi")[0] == 2  # <bos>


def test_html_tags_are_whole_tokens_and_rare_text_falls_back_to_bytes(tok):
    for tag in ("<b>", "</b>", "<div>", "<table>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
    ids = tok.encode("𓀀", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["<0xF0>", "<0x93>", "<0x80>", "<0x80>"]


def test_unused_ids_exclude_the_control_tokens(tok):
    drop = unused_ids(tok)
    assert len(drop) > 6000 and not drop & set(CONTROL)


def incremental(tok, ids, skip, drop=frozenset()):
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip, drop=drop)
    return "".join(d.push(i) for i in ids) + d.flush()


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(tok, text, skip):
    ids = tok.encode(text, add_special_tokens=False)
    assert incremental(tok, ids, skip) == tok.decode(ids, skip_special_tokens=skip)
    if not skip:
        assert tok.decode(ids) == text


def random_ids(rnd: random.Random, tok, n: int) -> list[int]:
    """What random weights emit: any id, unused tokens, control tokens, and characters that only exist as byte
    tokens (complete UTF-8 sequences)."""
    ids = []
    while len(ids) < n:
        pick = rnd.random()
        if pick < 0.2:
            ids += tok.encode(chr(rnd.choice([0x13000, 0x1D518, 0xA66E, 0x2028]) + rnd.randrange(8)),
                              add_special_tokens=False)
        elif pick < 0.3:
            ids.append(rnd.choice(list(CONTROL)))
        else:
            i = rnd.randrange(VOCAB)
            ids += [] if 236 <= i < 492 else [i]  # a lone byte token: see the test below
    return ids


@pytest.mark.parametrize("seed", range(3))
def test_incremental_equals_full_decode_on_random_ids(tok, seed):
    ids = random_ids(random.Random(seed), tok, 400)
    assert any(236 <= i < 492 for i in ids)  # byte fallback is in
    drop = unused_ids(tok)
    assert drop & set(ids)
    for skip in (True, False):
        full = tok.decode([i for i in ids if i not in drop], skip_special_tokens=skip)
        assert incremental(tok, ids, skip, drop) == full


def test_invalid_byte_runs_keep_their_valid_bytes(tok):
    """Byte tokens that never make a character: tokenizers' full decode replaces the whole run of byte tokens
    (`-` then 0xFA gives two U+FFFD); the incremental detokenizer has already emitted the `-` and writes one
    U+FFFD for the rest. The engine's text is the incremental one (it keeps the valid byte), so a full decode
    of the same ids can differ from it here, and only here."""
    ids = [340, 232098, 283, 488]  # f, ▁assuré, <0x2D>, <0xFA>
    assert tok.decode(ids) == "f assuré\ufffd\ufffd"
    assert incremental(tok, ids, False) == "f assuré-\ufffd"
