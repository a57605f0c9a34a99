"""compile smoke without inf2: its own logic (versions with local labels, a time limit per step, a step that
reported and then died, teacher-forced logit comparison) and its toy and tp1 steps run against the Neuron
test double, which keys weights with `->` as NxD does."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from compile import smoke

from doubles import neuron_double


def test_versions_with_local_labels_match_their_release():
    assert smoke.version_ok("2.26.6360.0+6f180f47", "2.26.6360.0")
    assert smoke.version_ok("2.26.6360.0", "2.26.6360.0")
    assert not smoke.version_ok("2.26.6361.0+6f180f47", "2.26.6360.0")
    assert not smoke.version_ok(None, "2.26.6360.0")


def test_a_step_past_its_time_limit_is_killed_and_reported():
    row = smoke._child("tp2", "0,1", timeout=1, cmd=[sys.executable, "-c", "import time; time.sleep(30)"])
    assert not row["ok"] and "timed out after 1s" in row["detail"] and row["seconds"] < 20


def test_a_step_that_reported_then_died_says_both():
    line = json.dumps({"ok": True, "detail": "3 calls, max diff 1e-4"})
    code = f"import sys; print({line!r}); print('nrt teardown failed', file=sys.stderr); sys.exit(134)"
    row = smoke._child("toy", "0", cmd=[sys.executable, "-c", code])
    assert not row["ok"] and row["detail"] == "3 calls, max diff 1e-4; then exited 134: nrt teardown failed"
    row = smoke._child("toy", "0", cmd=[sys.executable, "-c", "import sys; print('boom', file=sys.stderr); "
                                                                "sys.exit(1)"])
    assert not row["ok"] and row["detail"] == "crashed (exit 1): boom"


def test_logits_compare_per_call_tolerates_near_ties_only():
    want = [torch.tensor([[5.0, 4.9, 0.0], [9.0, 1.0, 0.0]])]
    near_tie_flipped = [torch.tensor([[4.9, 5.0, 0.0], [9.0, 1.0, 0.0]])]
    assert smoke.compare_logits(want, near_tie_flipped)[0]
    clear_flip = [torch.tensor([[5.0, 4.9, 0.0], [8.7, 9.2, 0.0]])]
    ok, detail = smoke.compare_logits(want, clear_flip)
    assert not ok and "argmax equal in 0/1 clear rows" in detail
    assert not smoke.compare_logits(want, [want[0] + 0.6])[0]  # past the logit tolerance


def test_toy_step_runs_against_the_double():
    """The toy keeps the weights the traces took: with NxD's `->` names a dotted filter kept nothing."""
    with neuron_double.installed():
        ok, detail = smoke._toy()
    assert ok, detail
    assert "weights ['emb.weight', 'scale']" in detail  # the KV buffer is state, the head reads the embedding


def test_topk_step_runs_the_tiled_op_at_the_real_width_against_the_double():
    """The smoke test's top-K step at [32, 262144]: the double's TopK refuses rows wider than 8,192, so this
    passes only through the tiles; a whole-row TopK fails the step."""
    with neuron_double.installed() as calls:
        ok, detail = smoke._topk()
    assert ok, detail
    assert "in tiles of 8192" in detail and "values equal, canonical ids equal" in detail
    assert ("forward", "topk") in calls
    from neuron_workers.model import tiled_topk

    with neuron_double.installed(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiled_topk, "tile_width", lambda width, k, limit=0: width)  # the old single op
        ok, detail = smoke._run_step("topk").values()
    assert not ok and "row of 262144" in detail


@pytest.mark.slow
def test_tp1_step_runs_against_the_double():
    with neuron_double.installed():
        ok, detail = smoke._tiny("gemma4-e2b-tiny", 1)
    assert ok, detail
    assert detail.startswith("tp=1: ") and "argmax equal in" in detail
