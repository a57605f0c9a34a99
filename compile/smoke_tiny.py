"""`compile smoke`'s tiny-checkpoint steps (tp1, tp2), against the CPU backend. WRITTEN AGAINST THE SDK, NOT RUN
ON HARDWARE HERE (tests/compile/test_smoke.py runs tp1 against the Neuron test double).

A tiny checkpoint is built at context 64 (batch 2, buckets 16 and 32, and the extend and mixed graphs of a 16-token
chunk: the tiny models' ring, window 8 + slack 8; with a tiny MTP drafter too: the draft graph and the `_h` candidate
graphs, at tp=2 its layers split over the two cores) and then:
  teacher   two prompts of 20 tokens (past the sliding window) decoded together on the CPU backend (bf16), and the
            very same inputs fed to the device, call by call: logits within LOGIT_TOL, the same argmax wherever the
            CPU's top two are further apart than 2 * LOGIT_TOL (`compare_logits`)
  top-K     on the device, greedy tokens through the top-K `decode` graph equal those through `decode_logits`
  extend    a 28-token prompt's first 12 tokens prefilled into a slot, then its next tokens through the extend
            graph (the chunk wraps the ring), on both backends with the same inputs: a full chunk through
            `extend_1x16_logits` (slot 0, `compare_logits`) and a short one through the top-K `extend_1x16`
            (slot 1, `compare_candidates`: values by rank within LOGIT_TOL, the same best id where clear)
  draft     after the extend step, one draft step for both slots on both backends with the same inputs
            (a seeded hidden state, the rows at their next positions, over the KV each wrote): the drafter's next
            hidden state within HIDDEN_RTOL of the CPU's largest value, the same draft id in every row whose two
            best drafter logits (CPU) are further apart than 2 * LOGIT_TOL (`draft_check`)
  mixed     slot 0 holds a prompt and decodes one token while slot 1 takes a 16-token chunk, in one `mixed_2x16` step
            (and its `_logits` variant) on both backends with the same inputs: the decode row and the chunk's last
            position compared as above, and with the drafter (`mixed_2x16_h`) their hidden states within
            HIDDEN_RTOL of the CPU's largest value (`mixed_check`)
  verify    the verify graph of 2 drafts (`extend_2x3_all_h`: every slot, per-position candidates; it reads the KV in
            place) on rows given out of slot order (slot 1, then slot 0 with a short row), against the CPU backend's
            (which gathers each slot's buffers): candidates of every real position compared (`verify_check`)
  times     every graph the device ran, its median time per call (`GraphTimes`)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

LOGIT_TOL = 0.5  # bf16 device vs bf16 CPU on logits of magnitude ~20 (tiny random weights)
HIDDEN_RTOL = 0.05  # the drafter's next hidden state, device vs CPU (bf16): of the CPU's largest |value|
CHUNK = 16  # T of the extend graphs the tiny builds trace (the tiny ring)
PROMPTS = [[2] + list(range(40, 59)), [2] + list(range(100, 119))]  # 20 tokens: the ring of 8 wraps
EXTEND_PROMPT = [2] + list(range(40, 67))  # 28 tokens: 12 prefilled, then a chunk at 12..27 (clear top two at tiny)


def tiny(name: str, tp: int) -> tuple[bool, str]:
    from compile.build import build
    from neuron_workers.backends.recorder import LogitsRecorder, replay
    from neuron_workers.config import EngineConfig
    from neuron_workers.engine.params import SamplingParams
    from neuron_workers.factory import build_engine
    from neuron_workers.testing.tiny import write_tiny
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny(Path(tmp), name)
        art = Path(tmp) / "art"
        drafter = str(write_tiny_assistant(ckpt, Path(tmp) / "drafter", seed=1))
        build(EngineConfig(str(ckpt), "neuron", tp, 64, (16, 32), "bfloat16", artifacts=str(art), max_batch=2,
                           prefill_chunk=CHUNK, draft_model=drafter, num_speculative_tokens=VERIFY_K),
              progress=lambda m: None, jobs=1)
        cpu = build_engine(EngineConfig(model=str(ckpt), max_context=64, prefill_buckets=(16, 32), max_batch=2,
                                        dtype="bfloat16"))
        rec = LogitsRecorder(cpu.backend, keep_inputs=True)
        cpu.backend = rec
        seqs = [cpu.new_sequence(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in PROMPTS]
        list(cpu.run_all(seqs))
        # no prefix cache: the second run below must compute what the first did, not reuse its KV
        device = build_engine(EngineConfig(model=str(ckpt), backend="neuron", tp=tp, artifacts=str(art),
                                           prefill_chunk=CHUNK, prefix_cache=False))
        backend = device.backend
        times = GraphTimes(backend)
        try:
            got = replay(backend, rec)  # the CPU's inputs, call by call: teacher forcing
            has_top = backend.candidates > 0
            top = _tokens(device, PROMPTS)  # the `decode` graph: greedy rows read its top-K candidates
            device.backend = LogitsRecorder(backend)  # the recorder asks for `decode_logits` every step
            full = _tokens(device, PROMPTS)
            ext_ok, ext = extend_check(rec.inner, backend, device.model.ple, device.dims.sliding_window, CHUNK,
                                       EXTEND_PROMPT)
            # the slots hold what extend_check wrote, the same on both backends
            draft_ok, drafted = draft_step(rec.inner, backend, drafter)
            mix_ok, mixed = mixed_check(rec.inner, backend, device.model.ple, device.dims.sliding_window, CHUNK)
            ver_ok, verified = verify_check(rec.inner, backend, device.model.ple, device.dims.sliding_window)
            ext_ok = ext_ok and draft_ok and mix_ok and ver_ok
            ext = f"{ext}; {drafted}; {mixed}; {verified}; graph times: {times.summary()}"
        finally:
            device.close()
            cpu.close()
    ok, msg = compare_logits([w for _, w in rec.calls], got, f"tp={tp}: ")
    agree = ("tokens equal" if top == full else "tokens DIFFER") if has_top else "MISSING"
    return ok and has_top and top == full and ext_ok, f"{msg}; top-K decode graph vs decode_logits: {agree}; {ext}"


VERIFY_K = 2  # drafts of the verify graph the tiny builds trace (`extend_2x3_all_h`)


class GraphTimes:
    """Wraps a backend's `_run` (and `draft`): seconds per call, by graph tag."""

    def __init__(self, backend):
        import time

        self.calls: dict[str, list[float]] = {}
        run, draft = backend._run, getattr(backend, "draft", None)

        def timed_run(spec, inputs):
            t = time.perf_counter()
            try:
                return run(spec, inputs)
            finally:
                self.calls.setdefault(spec.tag, []).append(time.perf_counter() - t)

        def timed_draft(inputs):
            t = time.perf_counter()
            try:
                return draft(inputs)
            finally:
                self.calls.setdefault("draft", []).append(time.perf_counter() - t)

        backend._run = timed_run
        if draft is not None:
            backend.draft = timed_draft

    def summary(self) -> str:
        import statistics

        return ", ".join(f"{tag} {statistics.median(t) * 1e3:.2f} ms x{len(t)}"
                         for tag, t in sorted(self.calls.items()))


def verify_check(cpu, device, ple, window: int) -> tuple[bool, str]:
    """After `mixed_check` (slot 0 holds PROMPTS[0] and its decoded token, slot 1 all of EXTEND_PROMPT): a verify
    step of VERIFY_K drafts over both slots, rows given out of slot order (slot 1, then slot 0 with one draft fewer),
    on both backends with the same inputs; every real position's candidates compared."""
    import torch

    from neuron_workers.model.extend_inputs import extend_inputs

    rows = [(1, [3, 4, 5][: VERIFY_K + 1], len(EXTEND_PROMPT)), (0, [9, 10, 11][:VERIFY_K], len(PROMPTS[0]) + 1)]
    out = {}
    for name, b in (("cpu", cpu), ("device", device)):
        spec = b.extend_spec(VERIFY_K + 1, b.max_batch, per_position=True)
        out[name] = b.extend(spec, extend_inputs(spec, rows, ple, window))
    tag = device.extend_spec(VERIFY_K + 1, device.max_batch, per_position=True).tag

    def real(c):  # [R, T, K] -> the real positions' rows [n, K]
        return [torch.cat([x[r, : len(ids)] for r, (_, ids, _) in enumerate(rows)]) for x in (c.values, c.ids)]

    return compare_candidates(real(out["cpu"]), real(out["device"]), f"{tag} (rows out of slot order): ")


def _tokens(engine, prompts) -> list[list[int]]:
    from neuron_workers.engine.params import SamplingParams

    seqs = [engine.new_sequence(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
    out = {s.seq_id: [] for s in seqs}
    for ev in engine.run_all(seqs):
        out[ev.seq_id].append(ev.token_id)
    return [out[s.seq_id] for s in seqs]


def extend_check(cpu, device, ple, window: int, chunk: int, prompt: list[int]) -> tuple[bool, str]:
    """The prompt's head (all but its last `chunk` tokens) prefilled into slot 0 and slot 1 of both backends,
    then the next tokens through the extend graph with the same host inputs: `chunk` of them through
    `extend_1x{chunk}_logits` in slot 0, fewer (a padded chunk) through the top-K `extend_1x{chunk}` in slot 1."""
    from neuron_workers.model.extend_inputs import extend_inputs
    from neuron_workers.model.host_inputs import choose_bucket, prefill_inputs
    from neuron_workers.model.spec import PREFILL

    head = prompt[: len(prompt) - chunk]
    bucket = choose_bucket(len(head), cpu.buckets)
    out = {}
    for slot, logits, n in ((0, True, chunk), (1, False, chunk - chunk // 4)):
        for name, b in (("cpu", cpu), ("device", device)):
            b.prefill(bucket, prefill_inputs(b.spec(PREFILL, bucket), head, ple, window, slot))
            spec = b.extend_spec(chunk, 1, logits=logits)
            out[name, logits] = b.extend(spec, extend_inputs(spec, [(slot, prompt[len(head):len(head) + n],
                                                                     len(head))], ple, window))
    ok_l, msg_l = compare_logits([out["cpu", True]], [out["device", True]], f"extend_1x{chunk}_logits: ")
    ok_c, msg_c = compare_candidates(out["cpu", False], out["device", False], f"extend_1x{chunk}: ")
    return ok_l and ok_c, f"{msg_l}; {msg_c}"


def mixed_check(cpu, device, ple, window: int, chunk: int) -> tuple[bool, str]:
    """Slot 0 holds PROMPTS[0] and decodes token 7; slot 1 holds EXTEND_PROMPT but its last `chunk` tokens and takes
    them: one `mixed_2x{chunk}` step and one `_logits` step (the same writes twice) on both backends with the same
    inputs; the decode row and the chunk's last position (rows 0 and 2) compared."""
    from neuron_workers.model.extend_inputs import extend_inputs, mixed_inputs
    from neuron_workers.model.host_inputs import DecodeBatch, choose_bucket, prefill_inputs
    from neuron_workers.model.spec import DECODE, PREFILL

    if not device.mixed_steps:
        return False, f"mixed_2x{chunk}: not built"
    head, out = EXTEND_PROMPT[: len(EXTEND_PROMPT) - chunk], {}
    for name, b in (("cpu", cpu), ("device", device)):
        for slot, ids in ((0, PROMPTS[0]), (1, head)):
            bucket = choose_bucket(len(ids), b.buckets)
            b.prefill(bucket, prefill_inputs(b.spec(PREFILL, bucket), ids, ple, window, slot))
        batch = DecodeBatch(b.spec(DECODE), ple, window)
        batch.start(0, len(PROMPTS[0]))
        batch.park(1, len(head))  # its decode row writes where the chunk writes first
        decode = dict(zip(batch.names, batch.inputs([(0, 7, len(PROMPTS[0]))])))
        one = b.extend_spec(chunk, 1)
        rows = extend_inputs(one, [(1, EXTEND_PROMPT[len(head):], len(head))], ple, window)
        rows = {x.name: t for x, t in zip(one.host_inputs, rows)}
        for logits in (True, False):
            spec = b.mixed_spec(chunk, logits=logits)
            out[name, logits] = b.extend(spec, mixed_inputs(spec, decode, rows))
    pick, tag = [0, 2], device.mixed_spec(chunk).tag
    ok_l, msg_l = compare_logits([out["cpu", True][pick]], [out["device", True][pick]], f"mixed_2x{chunk}_logits: ")
    ok_c, msg_c = compare_candidates([x[pick] for x in out["cpu", False][:2]],
                                     [x[pick] for x in out["device", False][:2]], f"{tag}: ")
    want_h, got_h = out["cpu", False].hidden, out["device", False].hidden
    if got_h is None and want_h is None:
        return ok_l and ok_c, f"{msg_l}; {msg_c}"
    if got_h is None or want_h is None:
        return False, f"{msg_l}; {msg_c}; {tag}: a hidden state from one backend only"
    ok_h, msg_h = compare_hidden(want_h[pick], got_h[pick])
    return ok_l and ok_c and ok_h, f"{msg_l}; {msg_c}; {tag}: {len(pick)} rows, {msg_h}"


def draft_step(cpu, device, drafter: str) -> tuple[bool, str]:
    """The drafter attached to the CPU backend, then `draft_check` of both slots after `extend_check` (slot 0 holds
    EXTEND_PROMPT, slot 1 all of it but its last CHUNK // 4 tokens)."""
    from neuron_workers.model.assistant import load_assistant

    cpu.attach_drafter(load_assistant(drafter, cpu.dtype))
    return draft_check(cpu, device, [len(EXTEND_PROMPT), len(EXTEND_PROMPT) - CHUNK // 4])


def draft_inputs(backend, positions: list[int], window: int):
    """One draft step's host inputs (`spec.draft_spec`) for rows drafting at `positions` (one per slot), in the
    backend's dtypes: token 7 in every row, a seeded hidden state of magnitude ~1."""
    import torch

    from neuron_workers.model.draft_graph import draft_masks
    from neuron_workers.model.spec import DRAFT

    spec = backend.spec(DRAFT)
    b, h = spec.host_inputs[1].shape[0], spec.host_inputs[1].shape[2]
    q = torch.tensor(positions + [-1] * (b - len(positions)))
    masks = draft_masks(q, backend.max_context, spec.host_inputs[4].shape[-1], window, torch.float32)
    hidden = torch.randn(b, 1, h, generator=torch.Generator().manual_seed(0))
    raw = (torch.full((b, 1), 7), hidden, q.clamp(min=0)[:, None], *masks)
    return tuple(x.to(t.dtype) for x, t in zip(raw, spec.host_inputs))


def draft_check(cpu, device, positions: list[int]) -> tuple[bool, str]:
    """One draft step for the rows at `positions` (slot i drafts at positions[i], over the KV both backends wrote
    the same) on the CPU backend (its drafter attached) and the device (its `draft` graph): the drafter's next
    hidden state within HIDDEN_RTOL of the CPU's largest value, the same draft id where the CPU's two best drafter
    logits are further apart than 2 * LOGIT_TOL."""
    window = cpu.draft_graph.assistant.model.config.sliding_window
    ins = draft_inputs(cpu, positions, window)
    want_ids, want_h = cpu.draft(ins)
    got_ids, got_h = device.draft(draft_inputs(device, positions, window))
    rows = len(positions)
    ok_h, msg_h = compare_hidden(want_h[:rows], got_h[:rows], "next ")
    margins = cpu.draft_graph.margins(*ins, *(cpu.kv[i] for i in cpu.draft_kv))[:rows]
    clear = margins > 2 * LOGIT_TOL
    same = clear & (want_ids[:rows, 0].long() == got_ids[:rows, 0].long())
    ok = ok_h and int(same.sum()) == int(clear.sum())
    return ok, f"draft: {rows} rows, {msg_h}; draft id equal in {int(same.sum())}/{int(clear.sum())} clear rows"


def compare_hidden(want, got, what: str = "") -> tuple[bool, str]:
    """Hidden states (device vs CPU): the largest |difference| within HIDDEN_RTOL of the CPU's largest |value|."""
    worst = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    return worst <= HIDDEN_RTOL * scale, f"max |{what}hidden diff| {worst:.3f} (tolerance {HIDDEN_RTOL} x {scale:.2f})"


def compare_logits(want: list, got: list, label: str = "") -> tuple[bool, str]:
    """Per call: max |logit diff| within LOGIT_TOL, and the same argmax in every row whose top two logits
    (reference) are further apart than 2 * LOGIT_TOL (closer rows are near-ties that bf16 may flip)."""
    worst, clear, same = 0.0, 0, 0
    for w, g in zip(want, got):
        w, g = w.float(), g.float()
        worst = max(worst, (w - g).abs().max().item())
        top2 = w.topk(2, dim=-1).values
        decided = (top2[:, 0] - top2[:, 1]) > 2 * LOGIT_TOL
        clear += int(decided.sum())
        same += int((decided & (w.argmax(-1) == g.argmax(-1))).sum())
    ok = len(want) == len(got) and worst < LOGIT_TOL and same == clear
    return ok, (f"{label}{len(got)} calls teacher-forced, max |logit diff| {worst:.3f} (tolerance {LOGIT_TOL}); "
                f"argmax equal in {same}/{clear} clear rows")


def compare_candidates(want, got, label: str = "") -> tuple[bool, str]:
    """Top-K candidates (values, ids; best first) of the same rows: values rank by rank within LOGIT_TOL (sorting
    moves no value further than the largest logit difference), and the same best id in every row whose two best
    values (reference) are further apart than 2 * LOGIT_TOL."""
    wv, gv = want[0].float(), got[0].float()
    if wv.shape != gv.shape or want[1].shape != got[1].shape:
        return False, f"{label}candidates of shape {tuple(gv.shape)}, the CPU's are {tuple(wv.shape)}"
    worst = (wv - gv).abs().max().item()
    decided = (wv[..., 0] - wv[..., 1]) > 2 * LOGIT_TOL
    same = decided & (want[1][..., 0].long() == got[1][..., 0].long())
    ok = worst < LOGIT_TOL and int(same.sum()) == int(decided.sum())
    return ok, (f"{label}{wv.shape[-1]} candidates, max |value diff| by rank {worst:.3f} (tolerance {LOGIT_TOL}); "
                f"best id equal in {int(same.sum())}/{int(decided.sum())} clear rows")
