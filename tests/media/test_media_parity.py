"""Images and audio: greedy tokens equal transformers' `generate` given the processor's pixel values / audio
features, on the tiny structures (one image, two images, image + audio, turn 2 reusing turn 1's image KV, batched
beside a text-only row, chunked prefill across a media span, TP=2); prefix keys follow the media's content."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine

from conftest import hf_reference

N = 6
CTX = 512


def image(seed: int, size=(20, 30)) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (*size, 3), dtype=np.uint8))


def audio(seed: int, seconds: float = 0.5) -> np.ndarray:
    return (np.random.RandomState(seed).randn(int(16000 * seconds)) * 0.1).astype(np.float32)


def prompt(media, text: str) -> str:
    return f"<bos><|turn>user\n{text} {media}<turn|>\n<|turn>model\n"


@pytest.fixture(scope="module")
def e2b(tiny_dirs):
    return tiny_dirs["gemma4-e2b-tiny"]


@pytest.fixture(scope="module")
def hf_e2b(e2b):
    return hf_reference(e2b)


def engine(path, **kw):
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(128, 256, 512), **kw))


def run(eng, text, images=(), audios=(), n=N):
    ids, items = eng.media.prepare(text, list(images), list(audios))
    seq = eng.new_sequence(ids, SamplingParams(max_tokens=n, ignore_eos=True), media=items)
    out = [ev.token_id for ev in eng.run_all([seq]) if getattr(ev, "token_id", None) is not None]
    return ids, out


def hf_run(model, eng, text, images=(), audios=(), n=N, **generate):
    proc = eng.media.processor
    kw = dict(text=[text], return_tensors="pt", add_special_tokens=False)
    if images:
        kw["images"] = [list(images)]
    if audios:
        kw["audio"] = list(audios)
    inputs = proc(**kw)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **generate)
    return inputs["input_ids"][0].tolist(), out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.fixture(scope="module")
def eng_e2b(e2b):
    return engine(e2b)


CASES = {"one image": ("<|image|>", [image(1)], []),
         "two images": ("<|image|> and <|image|>", [image(1), image(2, (40, 16))], []),
         "image and audio": ("<|image|> then <|audio|>", [image(3)], [audio(4)])}


@pytest.mark.parametrize("case", list(CASES))
def test_e2b_matches_transformers(eng_e2b, hf_e2b, case):
    media, images, audios = CASES[case]
    text = prompt(media, "Describe")
    ids, ours = run(eng_e2b, text, images, audios)
    hf_ids, theirs = hf_run(hf_e2b, eng_e2b, text, images, audios)
    assert ids == hf_ids
    assert ours == theirs


def test_different_images_differ(eng_e2b):
    text = prompt("<|image|>", "What is this?")
    a, b = (eng_e2b.media.prepare(text, [image(s)], [])[1][0] for s in (5, 6))
    assert a.digest != b.digest and not torch.equal(a.embeds, b.embeds)
    ids, _ = eng_e2b.media.prepare(text, [image(5)], [])
    keys_a = eng_e2b.new_sequence(ids, SamplingParams(max_tokens=1), media=[a]).keys
    keys_b = eng_e2b.new_sequence(ids, SamplingParams(max_tokens=1), media=[b]).keys
    assert keys_a[:a.offset] == keys_b[:a.offset] and keys_a[a.offset] != keys_b[a.offset]


def test_bad_media_is_a_user_error(eng_e2b):
    eng_e2b_media = eng_e2b.media
    with pytest.raises(UserError, match="placeholders"):
        eng_e2b.media.prepare(prompt("<|image|>", "x"), [], [])
    with pytest.raises(UserError, match="longer than"):
        eng_e2b.media.prepare(prompt("<|audio|>", "x"), [], [audio(1, 31.0)])
    with pytest.raises(UserError, match="no images"):
        eng_e2b.media = None
        try:
            eng_e2b.new_sequence([2, 5], SamplingParams(max_tokens=1), media=[object()])
        finally:
            eng_e2b.media = eng_e2b_media


def test_soft_tokens_without_media_are_fed_as_pad(eng_e2b, hf_e2b):
    """A text prompt holding soft-token ids: transformers embeds them as the pad token, and so does the engine."""
    ids = eng_e2b.tokenizer(prompt("<|image|><|audio|>", "x"), add_special_tokens=False).input_ids
    seq = eng_e2b.new_sequence(ids, SamplingParams(max_tokens=N, ignore_eos=True))
    assert seq.feed != ids and seq.keys == ids
    got = [ev.token_id for ev in eng_e2b.run_all([seq]) if getattr(ev, "token_id", None) is not None]
    want = hf_e2b.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N, min_new_tokens=N,
                           pad_token_id=0)[0, len(ids):].tolist()
    assert got == want


def _greedy(eng, seqs):
    out = {s.seq_id: [] for s in seqs}
    for ev in eng.run_all(seqs):
        if getattr(ev, "token_id", None) is not None:
            out[ev.seq_id].append(ev.token_id)
    return [out[s.seq_id] for s in seqs]


def test_e2b_batched_beside_text_and_chunked(e2b, hf_e2b, eng_e2b):
    text = prompt("<|image|> then <|audio|>", "Describe")
    _, want = hf_run(hf_e2b, eng_e2b, text, [image(7)], [audio(8)])
    eng = engine(e2b, max_batch=2, prefill_chunk=16)  # chunks of 16 cut the image's 70 soft tokens
    ids, items = eng.media.prepare(text, [image(7)], [audio(8)])
    plain = eng.tokenizer(prompt("", "Tell me a story"), add_special_tokens=False).input_ids
    seqs = [eng.new_sequence(ids, SamplingParams(max_tokens=N, ignore_eos=True), media=items),
            eng.new_sequence(plain, SamplingParams(max_tokens=N, ignore_eos=True))]
    got, text_only = _greedy(eng, seqs)
    assert got == want
    assert text_only == hf_e2b.generate(torch.tensor([plain]), do_sample=False, max_new_tokens=N, min_new_tokens=N,
                                        pad_token_id=0)[0, len(plain):].tolist()


def test_e2b_turn_two_reuses_the_image(e2b, hf_e2b):
    eng = engine(e2b, prefix_cache=True, prefill_chunk=16)
    turn1 = prompt("<|image|>", "What is this?")
    ids1, items1 = eng.media.prepare(turn1, [image(9)], [])
    first = _greedy(eng, [eng.new_sequence(ids1, SamplingParams(max_tokens=N, ignore_eos=True), media=items1)])[0]
    answer = eng.tokenizer.decode(first)
    turn2 = turn1 + answer + "<turn|>\n<|turn>user\nAnd now?<turn|>\n<|turn>model\n"
    ids2, items2 = eng.media.prepare(turn2, [image(9)], [])
    hits = eng.prefix.hit_tokens
    got = _greedy(eng, [eng.new_sequence(ids2, SamplingParams(max_tokens=N, ignore_eos=True), media=items2)])[0]
    assert eng.prefix.hit_tokens - hits > items2[0].end  # the image's KV came from turn 1
    _, want = hf_run(hf_e2b, eng, turn2, [image(9)])
    assert got == want


@pytest.mark.parametrize("name", ["gemma4-e4b-tiny", "gemma4-12b-tiny"])
def test_other_sizes_match_transformers(tiny_dirs, name):
    path = tiny_dirs[name]
    eng, hf = engine(path), hf_reference(path)
    assert eng.media.modalities == {"image", "audio"}  # the 12B's too, through our port where torchvision is absent
    text, images, audios = prompt("<|image|> then <|audio|>", "Describe"), [image(11)], [audio(12)]
    ids, ours = run(eng, text, images, audios)
    # the 12B's image blocks: transformers' static-cache masks (test_bidirectional.py says why)
    static = {"cache_implementation": "static"} if eng.media.bidirectional_images else {}
    hf_ids, theirs = hf_run(hf, eng, text, images, audios, **static)
    assert ids == hf_ids and ours == theirs


def test_e2b_tp2_matches_transformers(e2b, hf_e2b, eng_e2b):
    text = prompt("<|image|> then <|audio|>", "Describe")
    _, want = hf_run(hf_e2b, eng_e2b, text, [image(13)], [audio(14)])
    eng = engine(e2b, tp=2)
    try:
        assert run(eng, text, [image(13)], [audio(14)])[1] == want
    finally:
        eng.close()
