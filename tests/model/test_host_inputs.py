"""Host-side graph inputs: buckets, the ring index, prefill masks."""

from __future__ import annotations

import pytest
import torch

from neuron_workers.errors import ContextLengthError
from neuron_workers.model.host_inputs import choose_bucket, default_buckets, prefill_masks, ring_index


def test_buckets():
    assert default_buckets(256) == (32, 64, 128, 256)
    assert default_buckets(100) == (32, 64, 100)
    assert choose_bucket(33, (32, 64)) == 64 and choose_bucket(32, (32, 64)) == 32
    with pytest.raises(ContextLengthError):
        choose_bucket(65, (32, 64))


def test_ring_index_takes_last_position_per_slot():
    assert ring_index(3, 8).tolist() == [0, 1, 2, 0, 0, 0, 0, 0]
    assert ring_index(13, 8).tolist() == [8, 9, 10, 11, 12, 5, 6, 7]
    assert ring_index(16, 8).tolist() == list(range(8, 16))


def test_prefill_masks_window_and_padding():
    full, sliding = prefill_masks(5, 8, 3, torch.float32)
    ok_full, ok_sl = full[0, 0] == 0, sliding[0, 0] == 0
    assert ok_full[4].tolist() == [True] * 5 + [False] * 3  # last real row sees all 5 real keys
    assert ok_sl[4].tolist() == [False, False, True, True, True, False, False, False]  # (q-3, q]
    assert not ok_full[2, 3]  # causal
    assert torch.isfinite(full).all()  # finfo.min, never -inf
