"""`python -m compile smoke`: the first thing to run on an inf2 host. WRITTEN AGAINST THE SDK, NOT RUN HERE.

Steps, each in its own process (the Neuron runtime binds the cores it sees once per process) with a
time limit (a TP collective that hangs must still report):
  sdk      neuron-ls and the installed SDK versions against the pinned ones (local labels such as
           `2.26.6360.0+6f180f47` match their release)
  toy      a one-minute ModelBuilder V2 model with two graphs sharing one state buffer (read-then-write),
           a non-persistent buffer used in the forward, a head tied to the embedding module (as
           graph_model.TiedHead) and an int32 gather; three calls alternating the graphs, each checked
           against the same module on the CPU; the detail lists the weights the traces took
  topk     the `decode` graph's tiled top-K alone (`model.tiled_topk` with the SDK's TopK per tile) compiled
           at [TOPK_BATCH, 262144] (Gemma-4's real vocabulary, inf2.yaml's largest max_batch), run on bf16
           logits with ties, against torch.topk: values equal, ids equal in the host's canonical order (the
           tiny checkpoints' 512-token vocabulary cannot show what the compiler does with the real width)
  tp1      a tiny E2B-like checkpoint built at context 64 (batch 2) on core 0; two prompts of 20 tokens
           (past the sliding window of 8) decoded together on the CPU backend (bf16), and the very same
           inputs fed to the device (teacher forcing): logits per call within LOGIT_TOL, and the same argmax
           wherever the CPU's top two are further apart than 2 * LOGIT_TOL; then, on the device, greedy tokens
           through the top-K `decode` graph equal those through `decode_logits`
  tp2      the same with a tiny E4B-like checkpoint at tp=2 on cores 0-1
One table, PASS/FAIL per step (a step that reported and then exited non-zero says so, and fails); exit
1 if any step failed. Without the SDK: one line saying what to install, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuron_workers.errors import UserError

PINS = {"torch-neuronx": "2.9.0.2.15.32035", "neuronx-cc": "2.26.6360.0", "neuronx-distributed": "0.19.28492"}
STEPS = {"sdk": None, "topk": "0", "toy": "0", "tp1": "0", "tp2": "0,1"}  # step -> NEURON_RT_VISIBLE_CORES
STEP_TIMEOUT_S = {"sdk": 120, "topk": 1200, "toy": 1200, "tp1": 2400, "tp2": 2400}  # neuronx-cc: all but sdk
TOPK_BATCH, TOPK_WIDTH, TOPK_K = 32, 262144, 256
LOGIT_TOL = 0.5  # bf16 device vs bf16 CPU on logits of magnitude ~20 (tiny random weights)


def main(argv: list[str]) -> int:
    if argv:  # a child: run one step, print one JSON line
        print(json.dumps(_run_step(argv[0])), flush=True)
        return 0
    from neuron_workers.backends.neuron import require_neuron

    try:
        require_neuron()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = [_child(step, cores) for step, cores in STEPS.items()]
    width = max(len(r["step"]) for r in rows)
    for r in rows:
        print(f"{r['step']:<{width}}  {'PASS' if r['ok'] else 'FAIL'}  {r['seconds']:7.1f}s  {r['detail']}")
    return 0 if all(r["ok"] for r in rows) else 1


def _child(step: str, cores: str | None, timeout: float | None = None, cmd: list[str] | None = None) -> dict:
    env = dict(os.environ)
    if cores is not None:
        env["NEURON_RT_VISIBLE_CORES"] = cores
    timeout = timeout or STEP_TIMEOUT_S[step]
    t = time.perf_counter()
    row = {"step": step, "ok": False}
    try:
        p = subprocess.run(cmd or [sys.executable, "-m", "compile", "smoke", step], capture_output=True,
                           text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "seconds": time.perf_counter() - t, "detail": f"timed out after {timeout:.0f}s (a hung "
                                                                     f"collective or compile?); killed"}
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    if not lines:
        return {**row, "seconds": time.perf_counter() - t, "detail": f"crashed (exit {p.returncode}): {tail}"}
    out = {**json.loads(lines[-1]), "step": step, "seconds": time.perf_counter() - t}
    if p.returncode:  # it reported, then died (often the runtime at exit): say both, and fail
        out["detail"] = f"{out['detail']}; then exited {p.returncode}: {tail}"
        out["ok"] = False
    return out


def version_ok(got: str | None, want: str) -> bool:
    """An installed version matches its pin when the release matches: a local label (`+6f180f47`) is fine."""
    return got is not None and got.split("+", 1)[0] == want


def _run_step(step: str) -> dict:
    try:
        ok, detail = {"sdk": _sdk, "topk": _topk, "toy": _toy, "tp1": lambda: _tiny("gemma4-e2b-tiny", 1),
                      "tp2": lambda: _tiny("gemma4-e4b-tiny", 2)}[step]()
    except Exception as e:  # a smoke test reports, it does not stop at the first failure
        ok, detail = False, f"{type(e).__name__}: {e}"
    return {"ok": ok, "detail": detail}


def _sdk() -> tuple[bool, str]:
    from importlib import metadata

    try:
        ls = subprocess.run(["neuron-ls"], capture_output=True, text=True, timeout=60).stdout
    except OSError as e:
        ls = f"neuron-ls not runnable: {e}"
    print(ls, file=sys.stderr)
    got = {}
    for pkg in list(PINS) + ["libneuronxla", "torch-xla", "torch"]:
        try:
            got[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            got[pkg] = None
    off = {p: (got[p], want) for p, want in PINS.items() if not version_ok(got[p], want)}
    return not off and "NEURON" in ls.upper(), f"{got}; not the pinned versions: {off}" if off else str(got)


def _topk() -> tuple[bool, str]:
    import torch
    from torch import nn

    from neuron_workers.backends.neuron import require_neuron
    from neuron_workers.backends.neuron_build import neuron_topk
    from neuron_workers.engine.topk import MARGIN, canonical
    from neuron_workers.model.tiled_topk import tile_width, tiled_topk

    _, nxd = require_neuron()

    class TopKOnly(nn.Module):
        kv_names: list = []  # no device state

        def forward(self, logits):
            values, ids = tiled_topk(logits, TOPK_K, neuron_topk)
            return values, ids.to(torch.int32)

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(TOPK_BATCH, TOPK_WIDTH, generator=g) * 4).to(torch.bfloat16)  # bf16: many ties
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, nxd.NxDParallelState(world_size=1, tensor_model_parallel_size=1,
                                                                     lnc_size=1):
        builder = nxd.ModelBuilder(TopKOnly())
        builder.trace(args=(x,), tag="topk")
        model = builder.compile(compiler_args="--model-type=transformer --auto-cast=none --target inf2 -O2",
                                max_workers=1, compiler_workdir=tmp)
        compiled_s = time.perf_counter() - t
        model.set_weights([{}])
        model.to_neuron()
        values, ids = model.forward(x)
    want_v, want_i = torch.topk(x.float(), TOPK_K)
    same_v = torch.equal(values.float(), want_v)
    got = canonical(values.float(), ids.long(), TOPK_K - MARGIN)
    ref = canonical(want_v, want_i, TOPK_K - MARGIN)
    same_i = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    return same_v and same_i, (f"[{TOPK_BATCH}, {TOPK_WIDTH}] top-{TOPK_K} in tiles of "
                               f"{tile_width(TOPK_WIDTH, TOPK_K)}: compiled in {compiled_s:.0f}s; values "
                               f"{'equal' if same_v else 'DIFFER'}, canonical ids {'equal' if same_i else 'DIFFER'}")


def _toy() -> tuple[bool, str]:
    import torch
    from torch import nn

    from neuron_workers.backends.neuron import require_neuron
    from neuron_workers.backends.neuron_build import traced_weight_names
    from neuron_workers.model.graph_model import TiedHead, make_buffers_persistent

    _, nxd = require_neuron()

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(64, 16)
            self.head = TiedHead(self.emb)  # tied through the module, as graph_model does
            self.register_buffer("scale", torch.tensor(0.5), persistent=False)  # read by forward, not saved
            self.register_buffer("cache", torch.zeros(4, 16))  # device state
            self.kv_names = ["cache"]

        def forward(self, ids, slot):
            x = torch.index_select(self.emb.weight, 0, ids)  # int32 gather
            self.cache = torch.index_copy(self.cache, 0, slot.to(torch.int64), x[:1])  # read-then-write
            return self.head(self.cache.sum(0, keepdim=True) * self.scale)

    torch.manual_seed(0)
    ref, dev = Toy().eval(), Toy().eval()
    dev.load_state_dict(ref.state_dict())
    make_buffers_persistent(dev)
    calls = [(torch.tensor([3, 5, 7, 9], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)),
             (torch.tensor([1, 2, 3, 4, 5, 6, 7, 8], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)),
             (torch.tensor([11, 12, 13, 14], dtype=torch.int32), torch.tensor([2], dtype=torch.int32))]
    with tempfile.TemporaryDirectory() as tmp, nxd.NxDParallelState(world_size=1, tensor_model_parallel_size=1,
                                                                     lnc_size=1):
        builder = nxd.ModelBuilder(dev)
        builder.trace(args=calls[0], tag="four")
        builder.trace(args=calls[1], tag="eight")
        model = builder.compile(compiler_args="--auto-cast=none --target inf2", max_workers=1, compiler_workdir=tmp)
        names = set().union(*map(traced_weight_names, builder.trace_artifacts_collection.values()))
        state = {k: v for k, v in dev.state_dict().items() if k in names}
        model.set_weights([state])
        model.to_neuron()
        worst = 0.0
        for ids, slot in calls:
            want = ref(ids, slot)
            got = model.forward(ids, slot, model_name="four" if ids.shape[0] == 4 else "eight")
            got = got[0] if isinstance(got, (tuple, list)) else got
            worst = max(worst, (got.float() - want.float()).abs().max().item())
    return worst < 1e-3, (f"3 calls over 2 graphs sharing state: max |device - cpu| = {worst:.2e}; "
                          f"weights {sorted(names)}")


def _tiny(name: str, tp: int) -> tuple[bool, str]:
    from compile.build import build
    from neuron_workers.backends.recorder import LogitsRecorder, replay
    from neuron_workers.config import EngineConfig
    from neuron_workers.engine.params import SamplingParams
    from neuron_workers.factory import build_engine
    from neuron_workers.testing.tiny import write_tiny

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny(Path(tmp), name)
        art = Path(tmp) / "art"
        build(EngineConfig(str(ckpt), "neuron", tp, 64, (16, 32), "bfloat16", artifacts=str(art), max_batch=2),
              progress=lambda m: None, jobs=1)
        prompts = [[2] + list(range(40, 59)), [2] + list(range(100, 119))]  # 20 tokens: the ring of 8 wraps
        cpu = build_engine(EngineConfig(model=str(ckpt), max_context=64, prefill_buckets=(16, 32), max_batch=2,
                                        dtype="bfloat16"))
        rec = LogitsRecorder(cpu.backend, keep_inputs=True)
        cpu.backend = rec
        seqs = [cpu.new_sequence(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
        list(cpu.run_all(seqs))
        cpu.close()
        device = build_engine(EngineConfig(model=str(ckpt), backend="neuron", tp=tp, artifacts=str(art)))
        got = replay(device.backend, rec)  # the CPU's inputs, call by call: teacher forcing
        has_top = device.backend.candidates > 0
        top = _tokens(device, prompts)  # the `decode` graph: greedy rows read its top-K candidates
        device.backend = LogitsRecorder(device.backend)  # the recorder asks for `decode_logits` every step
        full = _tokens(device, prompts)
        device.close()
    ok, msg = compare_logits([w for _, w in rec.calls], got, f"tp={tp}: ")
    agree = ("tokens equal" if top == full else "tokens DIFFER") if has_top else "MISSING"
    return ok and has_top and top == full, f"{msg}; top-K decode graph vs decode_logits: {agree}"


def _tokens(engine, prompts) -> list[list[int]]:
    from neuron_workers.engine.params import SamplingParams

    seqs = [engine.new_sequence(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
    out = {s.seq_id: [] for s in seqs}
    for ev in engine.run_all(seqs):
        out[ev.seq_id].append(ev.token_id)
    return [out[s.seq_id] for s in seqs]


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
