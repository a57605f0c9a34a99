"""Our chat template (neuron_workers/testing/chat_template.py, the tiny checkpoints' template) renders exactly
what the published Gemma-4 templates render, string by string, on a battery of conversations (plain, system,
tools, tool loops, thinking on and off, content plus calls, reasoning replay, unresolved tool names, null
arguments, content lists with image / audio / video items in user, system, assistant and tool messages): the 07-09
E2B template, the 07-09 31B template (an empty thought channel when thinking is off) and
the April template. The references were rendered by make_renderings.py from the published templates into
data/gemma4_renderings.json (the templates themselves are not in the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_workers.testing.chat_template import VARIANTS, chat_template
from neuron_workers.testing.tiny_tokenizer import build_tokenizer

from chat_battery import CASES
from make_renderings import render

REFERENCE = json.loads((Path(__file__).with_name("data") / "gemma4_renderings.json").read_text())


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_every_version_and_case_has_a_reference():
    assert set(REFERENCE) == set(VARIANTS) and all(set(r) == set(CASES) for r in REFERENCE.values())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_our_template_renders_what_the_published_one_renders(tok, variant, case):
    assert render(tok, chat_template(variant), CASES[case]) == REFERENCE[variant][case]


def test_the_versions_differ_where_the_issue_says(tok):
    """07-09 ends a thinking tool loop inside the thought channel; April does not, and renders None as None;
    the 31B version opens an empty thought channel with thinking off; all close a text-plus-calls turn."""
    ref = REFERENCE
    assert ref["0709"]["tool_loop_thinking"].endswith("<tool_response|><|channel>thought\n")
    assert ref["april"]["tool_loop_thinking"].endswith("<tool_response|>")
    assert ref["0709-31b"]["plain"].endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert ref["0709"]["plain"].endswith("<|turn>model\n")
    assert "n:None" in ref["april"]["null_arguments"] and "n:null" in ref["0709"]["null_arguments"]
    assert all(r["content_and_calls"].endswith("Let me check.<turn|>\n") for r in ref.values())


def test_media_items_render_in_place_as_the_published_templates_write_them():
    """Every version writes a media item's placeholder where it stands, text items trimmed with nothing between;
    the first system message keeps only its items' text; only 07-09 writes media after a tool response's block;
    only April ends a tool-call turn whose content holds media (closed, then the generation prompt)."""
    for r in REFERENCE.values():
        assert "<|turn>user\n<|image|>What is it?<turn|>" in r["image_then_text"]
        assert "<|turn>user\nLook:<|image|><turn|>" in r["text_then_image"]
        assert "<|turn>user\n<|image|>and<|image|>then<|audio|><turn|>" in r["two_images_and_audio"]
        assert "<|turn>user\na<|image|>b<|audio|><turn|>" in r["media_text_whitespace"]
        assert "<|turn>user\n<|audio|><turn|>" in r["audio_only"]
        assert r["system_parts_with_image"].startswith("<bos><|turn>system\nBe brief.  <turn|>")
        assert "<|turn>model\nHere:<|image|><turn|>" in r["assistant_parts_with_media"]
        assert "<|turn>system\nNote<|image|><turn|>" in r["later_system_parts_with_media"]
    e2b, april = REFERENCE["0709"], REFERENCE["april"]
    assert "<|turn>user\n<|image|>hear<|audio|><|video|><turn|>" in e2b["openai_part_types"]
    assert "<|turn>user\nhear<|video|><turn|>" in april["openai_part_types"]
    assert e2b["tool_response_with_image"].endswith("{value:<|\"|>Sunny, radar:<|\"|>}<tool_response|><|image|>")
    assert april["tool_response_with_image"].endswith("{value:<|\"|>Sunny, radar:<|\"|>}<tool_response|>")
    assert e2b["calls_with_media_content"].endswith("<tool_call|>See:<|image|><|tool_response>")
    assert april["calls_with_media_content"].endswith("<|image|><turn|>\n<|turn>model\n<|channel>thought\n<channel|>")
