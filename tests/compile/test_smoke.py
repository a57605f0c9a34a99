"""compile smoke without inf2: its own logic (versions with local labels, a time limit per step, a step that
reported and then died, teacher-forced logit and candidate comparison, the extend and draft checks) and its toy,
topk and tp1 steps run against the Neuron test double, which keys weights with `->` as NxD does."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from compile import smoke, smoke_tiny
from neuron_workers.config import EngineConfig
from neuron_workers.factory import build_engine
from neuron_workers.model.spec import Candidates

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


def test_candidates_compare_by_rank_and_best_id_where_clear():
    ids = torch.tensor([[3, 1, 2], [0, 4, 1]])
    want = Candidates(torch.tensor([[5.0, 4.9, 1.0], [9.0, 2.0, 1.0]]), ids)
    swapped_near_tie = Candidates(want.values, torch.tensor([[1, 3, 2], [0, 4, 1]]))
    assert smoke_tiny.compare_candidates(want, swapped_near_tie)[0]
    ok, detail = smoke_tiny.compare_candidates(want, Candidates(want.values, torch.tensor([[3, 1, 2], [4, 0, 1]])))
    assert not ok and "best id equal in 0/1 clear rows" in detail  # row 1's best is clearly apart: must agree
    assert not smoke_tiny.compare_candidates(want, Candidates(want.values + 0.6, ids))[0]  # past the tolerance
    ok, detail = smoke_tiny.compare_candidates(want, Candidates(want.values[:, :2], ids[:, :2]))
    assert not ok and "shape (2, 2)" in detail


class Skewed:
    """A backend whose extend graphs return what they should plus `bias` (logits, or candidate values and the
    hidden state of the `_h` graphs; `only_hidden`: the hidden state alone)."""

    def __init__(self, backend, bias: float, only_hidden: bool = False):
        self.inner, self.bias, self.only_hidden = backend, bias, only_hidden

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def extend(self, spec, inputs):
        out = self.inner.extend(spec, inputs)
        bias = 0.0 if self.only_hidden else self.bias
        if not spec.candidates:
            return out.float() + bias
        hidden = None if out.hidden is None else out.hidden.float() + self.bias
        return Candidates(out.values.float() + bias, out.ids, hidden)

    def draft(self, inputs):
        ids, hidden = self.inner.draft(inputs)
        return ids, hidden.float() + self.bias


@pytest.mark.parametrize("bias,ok", [(0.0, True), (1.0, False)])
def test_extend_and_draft_checks_compare_with_the_cpu(tiny_dirs, tmp_path, bias, ok):
    """The smoke test's extend, draft and mixed steps on two CPU backends: equal graphs pass (with clear rows, so the
    argmax and best-id checks are not empty), and outputs off by more than the tolerance fail, in both extend
    variants, in the drafter's next hidden state and in the `_h` mixed graph's hidden states."""
    from neuron_workers.model.assistant import load_assistant
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    cfg = EngineConfig(model=str(tiny_dirs["gemma4-e2b-tiny"]), max_context=64, prefill_buckets=(16, 32),
                       max_batch=2, dtype="bfloat16")
    ref, dev = build_engine(cfg), build_engine(cfg)
    got, detail = smoke_tiny.extend_check(ref.backend, Skewed(dev.backend, bias), dev.model.ple,
                                          dev.dims.sliding_window, smoke_tiny.CHUNK, smoke_tiny.EXTEND_PROMPT)
    assert got == ok, detail
    assert "extend_1x16_logits: 1 calls" in detail and "extend_1x16: 256 candidates" in detail
    if ok:
        assert "argmax equal in 1/1 clear rows" in detail and "best id equal in 1/1 clear rows" in detail
    else:
        assert "max |logit diff| 1.000" in detail and "max |value diff| by rank 1.000" in detail
    drafter = write_tiny_assistant(tiny_dirs["gemma4-e2b-tiny"], tmp_path / "drafter", seed=1)
    dev.backend.attach_drafter(load_assistant(drafter, torch.bfloat16))
    got, detail = smoke_tiny.draft_step(ref.backend, Skewed(dev.backend, bias), str(drafter))
    assert got == ok and "draft id equal in 1/1 clear rows" in detail, detail
    assert ("max |next hidden diff| 0.000" if ok else "max |next hidden diff| 1.000") in detail, detail
    got, detail = smoke_tiny.mixed_check(ref.backend, Skewed(dev.backend, bias), dev.model.ple,
                                         dev.dims.sliding_window, smoke_tiny.CHUNK)
    assert got == ok and "mixed_2x16_logits: 1 calls" in detail and "mixed_2x16_h: 256 candidates" in detail, detail
    assert ("max |logit diff| 0.000" if ok else "max |logit diff| 1.000") in detail, detail
    assert f"mixed_2x16_h: 2 rows, max |hidden diff| {bias:.3f}" in detail, detail
    if ok:  # hidden states alone off by more than the tolerance fail too
        got, detail = smoke_tiny.mixed_check(ref.backend, Skewed(dev.backend, 1.0, only_hidden=True), dev.model.ple,
                                             dev.dims.sliding_window, smoke_tiny.CHUNK)
        assert not got and "max |logit diff| 0.000" in detail and "max |hidden diff| 1.000" in detail, detail


@pytest.mark.slow
def test_tp1_step_runs_against_the_double():
    """The tiny tp=1 step end to end against the double: teacher-forced logits, the top-K `decode_h` against
    `decode_logits`, the extend graphs (built for a 16-token chunk, the top-K one as `_h`: the build has a tiny
    MTP drafter) against the CPU backend's extend, one draft step of both slots against the CPU's, and a mixed
    step (a decode row and a chunk) in both mixed graphs (the top-K one as `_h`) against the CPU's."""
    with neuron_double.installed() as calls:
        ok, detail = smoke._run_step("tp1").values()
    assert ok, detail
    assert detail.startswith("tp=1: ") and "argmax equal in" in detail and "tokens equal" in detail
    assert "extend_1x16_logits: 1 calls" in detail and "best id equal in 1/1 clear rows" in detail
    assert "draft: 2 rows, max |next hidden diff| 0.000" in detail and "draft id equal in 1/1 clear rows" in detail
    assert "mixed_2x16_logits: 1 calls" in detail and "mixed_2x16_h: 256 candidates" in detail
    assert "mixed_2x16_h: 2 rows, max |hidden diff| 0.000" in detail
    # the verify graph of 2 drafts (in place) against the CPU's gathering one, rows out of slot order
    assert "extend_2x3_all_h (rows out of slot order): 256 candidates" in detail, detail
    assert "graph times: " in detail and "extend_2x3_all_h " in detail and "draft " in detail
    traced = [c[1] for c in calls if c[0] == "trace"]
    assert traced[-6:] == ["extend_1x16_h", "extend_1x16_logits", "mixed_2x16_h", "mixed_2x16_logits",
                           "extend_2x3_all_h", "draft"]
    ran = {c[1] for c in calls if c[0] == "forward"}
    assert {"decode_h", "decode_logits", "extend_1x16_h", "extend_1x16_logits", "mixed_2x16_h", "mixed_2x16_logits",
            "extend_2x3_all_h", "draft"} <= ran


def test_state_and_topk_timing_steps_run_against_the_double():
    """`state` compiles the pass-through, one-entry and full-rewrite graphs over one state buffer and prints a
    decision; `topkt` times the tiled top-K at the decode, tp=2 shard and verify shapes (the double: fp32 tiles
    only). The decision rule: a clone that costs about the one-entry write is aliased, one that costs a copy is not."""
    from compile import smoke_state

    from doubles import neuron_double_units as units

    with neuron_double.installed() as calls:
        ok, detail = smoke._run_step("state").values()
        assert ok and "passthrough" in detail and "rmw1" in detail and "decision: " in detail, detail
        assert [c[1] for c in calls if c[0] == "trace"] == ["passthrough", "rmw1", "copy"]
        ok, detail = smoke._run_step("topkt").values()
        assert ok and "decode [32, 262144]" in detail and "verify [160, 262144]" in detail, detail
        assert units.TOPK_CALLS and all(dt == torch.float32 for dt, _, _ in units.TOPK_CALLS)
    assert smoke_state.decide(1e-4, 1e-4, 5e-3).startswith("aliased")
    assert smoke_state.decide(5e-3, 1e-4, 5e-3).startswith("COPIES") and "GEMMA4_DRAFT_STATE=rmw" in \
        smoke_state.decide(5e-3, 1e-4, 5e-3)
