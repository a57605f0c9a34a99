"""Host-side sampling: greedy, seeded top-k / top-p draws, the soft-cap, per-row batched sampling."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.engine.params import SamplingParams
from neuron_workers.engine.sampling import sample, soft_cap
from neuron_workers.errors import UserError

VOCAB = 64


def test_same_seed_same_samples_and_temperature_zero_is_greedy():
    a = sample_seq(seed=11)
    assert a == sample_seq(seed=11)
    assert a != sample_seq(seed=12)
    logits = torch.randn(VOCAB)
    assert sample(logits, SamplingParams(temperature=0.0), 30.0, None) == int(logits.argmax())


def sample_seq(seed, n=30):
    from neuron_workers.engine.sampling import make_generator

    g = make_generator(seed)
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9)
    return [sample(logits, params, 30.0, g) for _ in range(n)]


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(VOCAB)
    g = torch.Generator().manual_seed(0)
    assert sample(logits, SamplingParams(temperature=1.0, top_k=1), 30.0, g) == int(logits.argmax())
    assert sample(logits, SamplingParams(temperature=1.0, top_p=1e-6), 30.0, g) == int(logits.argmax())


def test_soft_cap_fp32_and_monotone():
    z = torch.tensor([-200.0, -1.0, 0.0, 1.0, 200.0], dtype=torch.bfloat16)
    capped = soft_cap(z, 30.0)
    assert capped.dtype == torch.float32 and capped.abs().max() <= 30.0
    assert torch.all(capped[1:] > capped[:-1])


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(temperature=3), dict(top_p=0), dict(top_k=-2),
                                dict(max_tokens=0)])
def test_bad_sampling_params(kw):
    with pytest.raises(UserError):
        SamplingParams(**kw)


def test_sampling_follows_the_distribution_and_top_p_cuts_the_tail():
    from neuron_workers.engine.sampling import make_generator

    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    g = make_generator(1)
    counts = torch.zeros(3)
    for _ in range(6000):
        counts[sample(logits, SamplingParams(temperature=1.0), None, g)] += 1
    assert torch.allclose(counts / 6000, torch.tensor([0.5, 0.3, 0.2]), atol=0.03)
    counts.zero_()
    for _ in range(4000):  # top_p 0.6 keeps the two tokens whose mass first reaches 0.6: 5:3
        counts[sample(logits, SamplingParams(temperature=1.0, top_p=0.6), None, g)] += 1
    assert counts[2] == 0 and abs(counts[0] / counts[:2].sum() - 0.625) < 0.03


# --- continuous batching pieces, without a model ---------------------------------------------------------

def test_sample_rows_is_per_row_and_matches_single_row_sampling():
    """Mixed greedy and sampled rows in one call: each row's token equals sampling that row alone with a
    generator in the same state, whatever else shares the call."""
    from neuron_workers.engine.sampling import Row, make_generator, sample_rows

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 262_144, generator=g).to(torch.bfloat16)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=64, top_p=0.95, seed=1),
              SamplingParams(temperature=0.7, top_k=64, top_p=0.5, seed=2), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.3, top_k=8, seed=4), SamplingParams(temperature=0.9, seed=5)]
    for trial in range(3):
        gens = [None if p.greedy else make_generator(p.seed + trial) for p in params]
        together = sample_rows(logits, [Row(r, p, g) for r, (p, g) in enumerate(zip(params, gens))], 30.0)
        alone = []
        for r, p in enumerate(params):
            g1 = None if p.greedy else make_generator(p.seed + trial)
            alone.append(sample_rows(logits, [Row(r, p, g1)], 30.0)[0])
        assert together == alone
    assert together[0].token == int(logits[0].float().argmax())
    assert together[3].token == int(logits[3].float().argmax())


@pytest.mark.parametrize("vocab", [262_144, 1000])  # chunked, and the plain-torch path
def test_chunked_argmax_and_topk_equal_torch(vocab):
    from neuron_workers.engine.sampling import Chunked

    z = torch.randn(5, vocab, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    z[2, [5, 900]] = 50.0  # a tie: the first index wins
    c, idx = Chunked(z), torch.tensor([4, 2, 0])
    assert torch.equal(c.argmax(idx), z.float()[idx].argmax(dim=1))
    vals, ids = c.topk(idx, 64)
    assert torch.equal(vals, z.float()[idx].topk(64, dim=1).values) and torch.equal(z.float()[idx].gather(1, ids), vals)


def bitmask_of(allowed: list[int], vocab: int) -> torch.Tensor:
    """The int32 bitmask llguidance fills: bit j of word i allows token 32 i + j."""
    import numpy as np

    bits = np.zeros((vocab + 31) // 32 * 32, dtype=bool)
    bits[allowed] = True
    return torch.from_numpy(np.packbits(bits, bitorder="little").view(np.int32).copy())


def test_masked_and_logprob_rows_beside_plain_rows():
    """A row under a token mask only ever gets an allowed token, greedy or sampled; logprobs are the
    log-softmax of the capped fp32 logits; the plain rows beside them get what they get alone."""
    from neuron_workers.engine.distribution import unpack_bitmask
    from neuron_workers.engine.sampling import Row, make_generator, sample_rows

    vocab = 1000
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(7)) * 5
    allowed = [3, 77, 500, 999]
    mask = bitmask_of(allowed, vocab)
    assert unpack_bitmask(mask, vocab).nonzero().flatten().tolist() == allowed
    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0, top_k=2)
    for seed in range(20):
        rows = [Row(0, greedy, None), Row(1, greedy, None, mask), Row(2, sampled, make_generator(seed), mask),
                Row(3, sampled, make_generator(seed), None, 3)]
        got = sample_rows(logits, rows, 30.0)
        assert got[0] == sample_rows(logits, [rows[0]], 30.0)[0]
        assert got[1].token == max(allowed, key=lambda t: logits[1, t])
        assert got[2].token in allowed
        lp = torch.log_softmax(30.0 * torch.tanh(logits[3] / 30.0), dim=-1)
        assert got[3].logprob == pytest.approx(float(lp[got[3].token]), abs=1e-6)
        assert [t for t, _ in got[3].top] == lp.topk(3).indices.tolist()
    nothing = torch.zeros_like(mask)
    assert sample_rows(logits, [Row(0, greedy, None, nothing)], 30.0)[0].error


def test_a_vanishing_temperature_is_greedy():
    from neuron_workers.engine.sampling import Row, make_generator, sample_rows

    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(2)) * 4
    for t in (1e-300, 1e-9):
        p = SamplingParams(temperature=t, top_k=5)
        rows = [Row(r, p, make_generator(1)) for r in range(3)]
        assert [s.token for s in sample_rows(logits, rows, 30.0)] == logits.argmax(dim=1).tolist()
