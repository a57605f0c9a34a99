"""What T new tokens per row cost against one decode step (speculative decoding's cost model), side by side.

    python bench/extend_cost.py [--backend cpu|xla] [--batch 4] [--reps 20] [--draft]

On the E4B-like tiny checkpoint (context 256), after a prefill into every slot: the median time of the top-K
`decode` step (B rows x 1 token) and of the per-position extend graph (`extend_BxT_all`: B rows x T tokens,
every position's top-K candidates) for T = 2, 4, 8, interleaved, and their ratio. The xla backend (the module
the Neuron build traces, on torch-xla's CPU device) runs in the xla venv:
`PYTHONPATH=$PWD ~/.cache/gemma4-xla-venv-*/bin/python bench/extend_cost.py --backend xla`.
With `--draft`, a tiny random MTP drafter (`testing.tiny_assistant`: 2 layers, hidden 32, the centroid-masked
head) is attached: the decode step is then the variant that also returns the hidden state, and one draft step
(every slot, reading the target's KV) is timed beside it: an MTP round costs k draft steps + one verify.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.factory import build_engine  # noqa: E402
from neuron_workers.model.draft_graph import draft_masks  # noqa: E402
from neuron_workers.model.extend_inputs import extend_inputs  # noqa: E402
from neuron_workers.model.host_inputs import prefill_inputs  # noqa: E402
from neuron_workers.model.spec import PREFILL  # noqa: E402
from neuron_workers.testing.tiny import ensure_tiny  # noqa: E402
from neuron_workers.testing.tiny_assistant import write_tiny_assistant  # noqa: E402

CTX, PROMPT = 256, 100


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cpu", "xla"], default="cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--draft", action="store_true", help="also time one MTP draft step (a tiny random drafter)")
    args = ap.parse_args(argv)
    d = ensure_tiny(Path(tempfile.gettempdir()) / "gemma4-bench-tiny")["gemma4-e4b-tiny"]
    draft = write_tiny_assistant(d, Path(tempfile.gettempdir()) / "gemma4-bench-e4b-assistant") if args.draft else None
    eng = build_engine(EngineConfig(model=str(d), backend=args.backend, max_context=CTX, max_batch=args.batch,
                                    prefill_buckets=(128,), prefill_chunk=0,
                                    draft_model=str(draft) if draft else None))
    be, ple, window = eng.backend, eng.model.ple, eng.dims.sliding_window
    prompt = [2] + [(5 * i + 7) % 400 + 5 for i in range(PROMPT - 1)]
    for slot in range(args.batch):
        be.prefill(128, prefill_inputs(be.spec(PREFILL, 128), prompt, ple, window, slot))
    for slot in range(args.batch):
        eng.batch.start(slot, PROMPT)
    decode_in = eng.batch.inputs([(s, 9, PROMPT) for s in range(args.batch)])
    calls = {"decode": lambda: be.decode_candidates(decode_in)}
    if draft:
        ids, hidden = torch.full((args.batch, 1), 9), torch.randn(args.batch, 1, eng.dims.hidden_size)
        masks = draft_masks(torch.full((args.batch,), PROMPT), CTX, eng.batch.ring, window, torch.float32)
        draft_in = (ids.to(decode_in[0].dtype), hidden, torch.full((args.batch, 1), PROMPT, dtype=decode_in[0].dtype),
                    *masks)
        calls["draft step"] = lambda: be.draft(draft_in)
    for t in (2, 4, 8):
        spec = be.extend_spec(t, args.batch, per_position=True)
        ins = extend_inputs(spec, [(s, [9] * t, PROMPT) for s in range(args.batch)], ple, window)
        calls[f"T={t}"] = lambda spec=spec, ins=ins: be.extend(spec, ins)
    times = {k: [] for k in calls}
    for fn in calls.values():  # build / compile every graph first
        fn()
    for _ in range(args.reps):
        for k, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["decode"])
    print(f"{args.backend}, e4b-tiny, B={args.batch}, context {CTX}, threads {torch.get_num_threads()}: "
          f"decode step {base * 1e3:.2f} ms")
    for k in list(calls)[1:]:
        m = statistics.median(times[k])
        print(f"  {'' if k.startswith('draft') else 'extend '}{k}: {m * 1e3:7.2f} ms = {m / base:5.2f}x a decode step")
    eng.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
