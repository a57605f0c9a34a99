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
  tp1      a tiny E2B-like checkpoint built at context 64 (batch 2, with the extend graphs of a 16-token
           chunk) on core 0 (`smoke_tiny`): two prompts of 20 tokens (past the sliding window of 8) decoded
           together on the CPU backend (bf16), and the very same inputs fed to the device (teacher forcing):
           logits per call within LOGIT_TOL, and the same argmax wherever the CPU's top two are further apart
           than 2 * LOGIT_TOL; on the device, greedy tokens through the top-K `decode` graph equal those through
           `decode_logits`; then a prompt's head prefilled and its next chunk through `extend_1x16_logits`
           (logits compared the same way) and the top-K `extend_1x16` (candidates: values by rank within
           LOGIT_TOL, the same best id where clear), against the CPU backend's extend with the same inputs;
           the build has a tiny MTP drafter too (its draft graph and the `_h` candidate graphs): one draft step of
           both slots against the CPU backend's (next hidden state within HIDDEN_RTOL, draft ids where clear);
           and a decode row beside a 16-token chunk through `mixed_2x16_h` and `mixed_2x16_logits` against the
           CPU backend's mixed graph, the `_h` one's hidden states within HIDDEN_RTOL too (`mixed_check`)
  tp2      the same with a tiny E4B-like checkpoint at tp=2 on cores 0-1 (its drafter's layers split over the
           two cores; the CPU reference runs it whole)
  (tp1 and tp2 also build the verify graph of 2 drafts, `extend_2x3_all_h`, which reads the KV in place, and check
  it against the CPU backend's gathering one on the same rows, given out of slot order; and time every graph)
  state    does an unchanged clone of a state buffer (the draft graph's) copy it? timed against a one-entry write
           and a full rewrite; prints the decision (`smoke_state`)
  topkt    the tiled top-K timed at the decode, tp=2-shard and verify shapes (`smoke_state`)
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

from compile.smoke_tiny import LOGIT_TOL, compare_logits, tiny  # noqa: F401 (the tiny steps; names tests use)
from neuron_workers.errors import UserError

PINS = {"torch-neuronx": "2.9.0.2.15.32035", "neuronx-cc": "2.26.6360.0", "neuronx-distributed": "0.19.28492"}
STEPS = {"sdk": None, "topk": "0", "toy": "0", "state": "0", "topkt": "0", "tp1": "0",
         "tp2": "0,1"}  # step -> NEURON_RT_VISIBLE_CORES
STEP_TIMEOUT_S = {"sdk": 120, "topk": 1200, "toy": 1200, "state": 1200, "topkt": 1800, "tp1": 2400,
                  "tp2": 2400}  # neuronx-cc: all but sdk
TOPK_BATCH, TOPK_WIDTH, TOPK_K = 32, 262144, 256


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
    state = next(r for r in rows if r["step"] == "state")
    print("read-only state (the draft graph): " + (state["detail"].split("decision: ", 1)[-1] if state["ok"] else
                                                   "undecided (the state step failed); keep GEMMA4_DRAFT_STATE=rmw"))
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
        from compile.smoke_state import state_step, topk_times_step

        ok, detail = {"sdk": _sdk, "topk": _topk, "toy": _toy, "state": state_step, "topkt": topk_times_step,
                      "tp1": lambda: tiny("gemma4-e2b-tiny", 1), "tp2": lambda: tiny("gemma4-e4b-tiny", 2)}[step]()
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
