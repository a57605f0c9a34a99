"""The 12B's images (`gemma4_unified`, `use_bidirectional_attention="vision"`): an image's soft tokens see each other
on sliding layers (window AND (causal OR block), full layers causal: transformers' `create_masks_for_vision_model`,
what its `generate` uses with a static cache). The pixel patches here are made directly, of any grid (what the
unified image processor returns: merged patches and their grid positions); a block longer
than the window, whole prompts and chunked (a chunk never cuts a block), and turn 2 reusing the block's KV."""

from __future__ import annotations

import pytest
import torch
from test_media_parity import engine

from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.media.types import MediaInput, media_digest
from neuron_workers.model.host_inputs import prefill_inputs
from neuron_workers.model.spec import PREFILL

from conftest import hf_reference

N = 6


def patches(seed: int, h: int, w: int, dim: int):
    """Pixel patches [1, h*w, dim] in [0, 1] and their (x, y) positions [1, h*w, 2], row-major like the processor."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.rand(1, h * w, dim, generator=g), torch.stack([xs, ys], -1).reshape(1, h * w, 2)


@pytest.fixture(scope="module")
def unified(tiny_dirs):
    path = tiny_dirs["gemma4-12b-tiny"]
    return path, hf_reference(path)


def build(eng, grids, turn2: str = ""):
    """Prompt ids with one image block per (seed, h, w), its MediaInputs, and transformers' inputs."""
    cfg, tok = eng.media.encoders.config, eng.tokenizer
    dim = cfg.vision_config.patch_size ** 2 * cfg.vision_config.pooling_kernel_size ** 2 * 3
    ids = tok("<bos><|turn>user\nLook", add_special_tokens=False).input_ids
    items, pix, pos = [], [], []
    for seed, h, w in grids:
        pv, pp = patches(seed, h, w, dim)
        embeds = eng.media.encoders.image(pv, pp)
        ids += [cfg.boi_token_id]
        items.append(MediaInput("image", len(ids), embeds, media_digest("image", pv.numpy().tobytes()), True))
        ids += [cfg.image_token_id] * embeds.shape[0] + [cfg.eoi_token_id]
        pix.append(pv)
        pos.append(pp)
    ids += tok(" here<turn|>\n<|turn>model\n" + turn2, add_special_tokens=False).input_ids
    types = [1 if t == cfg.image_token_id else 0 for t in ids]
    most = max(p.shape[1] for p in pix)  # padded as the processor pads: zero patches at position (-1, -1)
    pix = [torch.cat([p, p.new_zeros(1, most - p.shape[1], p.shape[2])], 1) for p in pix]
    pos = [torch.cat([p, p.new_full((1, most - p.shape[1], 2), -1)], 1) for p in pos]
    hf = dict(pixel_values=torch.cat(pix), image_position_ids=torch.cat(pos), mm_token_type_ids=torch.tensor([types]))
    return ids, items, hf


def hf_greedy(model, ids, hf):
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **hf,
                         do_sample=False, max_new_tokens=N, min_new_tokens=N, pad_token_id=0,
                         cache_implementation="static")
    return out[0, len(ids):].tolist()


def greedy(eng, ids, items):
    seq = eng.new_sequence(ids, SamplingParams(max_tokens=N, ignore_eos=True), media=items)
    return [ev.token_id for ev in eng.run_all([seq]) if getattr(ev, "token_id", None) is not None]


@pytest.mark.parametrize("chunk", [0, 16])
def test_image_blocks_match_transformers(unified, chunk):
    path, hf = unified
    eng = engine(path, prefill_chunk=chunk)
    ids, items, inputs = build(eng, [(1, 3, 4), (2, 2, 5)])  # 12 and 10 soft tokens: longer than the window (8)
    assert greedy(eng, ids, items) == hf_greedy(hf, ids, inputs)


def test_bidirectional_matters(unified):
    path, _ = unified
    eng = engine(path)
    ids, items, _ = build(eng, [(1, 3, 4)])
    causal = [MediaInput(m.kind, m.offset, m.embeds, m.digest, False) for m in items]
    spec = eng.backend.spec(PREFILL, 128)
    logits = [eng.backend.prefill(128, prefill_inputs(spec, ids, None, eng.dims.sliding_window, 0,
                                                      eng.new_sequence(ids, SamplingParams(max_tokens=1),
                                                                       media=m).media_rows(0, len(ids))))
              for m in (items, causal)]
    assert not torch.allclose(*logits, atol=1e-3)  # the first token's logits move when the block is causal


def test_turn_two_reuses_the_block(unified):
    path, hf = unified
    eng = engine(path, prefix_cache=True, prefill_chunk=16)
    ids, items, _ = build(eng, [(3, 3, 4)])
    first = greedy(eng, ids, items)
    turn2 = eng.tokenizer.decode(first) + "<turn|>\n<|turn>user\nAnd now?<turn|>\n<|turn>model\n"
    ids2, items2, inputs2 = build(eng, [(3, 3, 4)], turn2)
    hits = eng.prefix.hit_tokens
    got = greedy(eng, ids2, items2)
    assert eng.prefix.hit_tokens - hits > items2[0].end
    assert got == hf_greedy(hf, ids2, inputs2)


def test_a_block_longer_than_the_chunk_is_refused(unified):
    path, _ = unified
    eng = engine(path, prefill_chunk=16)
    ids, items, _ = build(eng, [(4, 4, 5)])  # 20 soft tokens > 16
    with pytest.raises(UserError, match="prefill chunk"):
        eng.new_sequence(ids, SamplingParams(max_tokens=1), media=items)
