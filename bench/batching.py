"""Continuous batching at the engine level: aggregate decode tokens/s at B = 1, 2, 4, 8 on one model,
same run, the same sequences at every B.

    python bench/batching.py [--model gemma4-e2b-tiny] [--tokens 128] [--max-context 512] [--threads 1]

B sequences are admitted and prefilled (not timed), then the engine steps until all finish; every
sequence decodes `--tokens` tokens. Each B's greedy tokens are checked against B=1's. Prints tok/s per B
and the ratio to B=1 (goal: >= 6x at B=8).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.factory import build_engine  # noqa: E402
from neuron_workers.testing.tiny import ensure_tiny  # noqa: E402


def run(engine, prompts, n) -> tuple[float, list[list[int]]]:
    seqs = [engine.new_sequence(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p in prompts]
    out = {s.seq_id: [] for s in seqs}
    for s in seqs:
        engine.add(s)
    for ev in engine.step():  # admission + prefill of all B (not timed)
        out[ev.seq_id].append(ev.token_id)
    t, decoded = time.perf_counter(), 0
    while engine.has_work:
        for ev in engine.step():
            out[ev.seq_id].append(ev.token_id)
            decoded += 1
    return decoded / (time.perf_counter() - t), [out[s.seq_id] for s in seqs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma4-e2b-tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    sizes = (1, 2, 4, 8)
    prompts = [[2] + [(13 * i + 7 * j) % 500 + 5 for j in range(20 + 3 * i)] for i in range(max(sizes))]
    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_tiny(tmp)[args.model]
        rate, ref = {}, {}
        for b in sizes:
            engine = build_engine(EngineConfig(model=str(path), max_context=args.max_context, max_batch=b,
                                               threads=args.threads, prefix_cache=False))  # prompts repeat
            run(engine, prompts[:b], 8)  # warm-up
            best = 0.0
            for _ in range(args.repeats):
                r, toks = run(engine, prompts[:b], args.tokens)
                best = max(best, r)
                for p, t in zip(prompts[:b], toks):
                    assert ref.setdefault(tuple(p), t) == t, "batched tokens differ from B=1's"
            rate[b] = best
    print(f"model {args.model} (cpu, eager, fp32, {torch.get_num_threads()} thread(s)), context "
          f"{args.max_context}, {args.tokens} tokens per sequence, best of {args.repeats}")
    for b in sizes:
        print(f"B={b}: {rate[b]:8.1f} tok/s   ratio to B=1 {rate[b] / rate[1]:5.2f}")
    print(f"ratio at B=8: {rate[8] / rate[1]:.2f}x  (goal >= 6x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
