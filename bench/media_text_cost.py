"""What serving media costs text-only traffic: the same text requests on an engine with media on (the checkpoint's
encoders loaded, `mm_embeds` as one more prefill / extend input, media soft tokens fed as pad) and with media off
(the engine as it was before media: no `mm_embeds`, no soft-token mapping), side by side in one run.

    python bench/media_text_cost.py [--models e2b,e4b,12b] [--rows 4] [--prompt 64] [--steps 32] [--reps 5]

Tiny checkpoints on the cpu backend (written to a temporary folder), fp32, greedy: per rep, each engine prefills
`--rows` prompts of `--prompt` tokens and decodes `--steps` steps; the reps alternate between the two engines so
the box's load falls on both. Prints the median ms of a prefill step and of a decode step, and on / off ratios
(1.00 = no cost; the decode graph is the same in both, so its ratio is host noise plus the soft-token mapping).
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

from neuron_workers import factory  # noqa: E402
from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.testing.tiny import ensure_tiny  # noqa: E402

NAMES = {"e2b": "gemma4-e2b-tiny", "e4b": "gemma4-e4b-tiny", "12b": "gemma4-12b-tiny"}


def build(path: Path, media: bool):
    """An engine on `path`, with media (as served) or without (the text-only engine media came beside)."""
    real = factory.with_media
    if not media:
        factory.with_media = lambda model: None
    try:
        eng = factory.build_engine(EngineConfig(model=str(path), max_context=512, max_batch=8, prefill_chunk=0))
    finally:
        factory.with_media = real
    if not media:
        eng.soft_ids = frozenset()
        eng.batch.pad_ids = torch.zeros(0, dtype=torch.int64)
    return eng


def one_rep(eng, rows: int, prompt: int, steps: int) -> tuple[float, float]:
    """(ms of the step that prefills every row, median ms of a decode step)."""
    seqs = [eng.new_sequence([2] + [(7 * i + r) % 400 + 3 for i in range(prompt - 1)],
                             SamplingParams(max_tokens=steps + 1, ignore_eos=True)) for r in range(rows)]
    for s in seqs:
        eng.add(s)
    t = time.perf_counter()
    while any(s.next_position < prompt for s in seqs):
        eng.step()
    prefill = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.step()
        times.append((time.perf_counter() - t) * 1e3)
    for s in seqs:
        eng.cancel(s.seq_id)
    while eng.has_work:
        eng.step()
    return prefill, statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="e2b,e4b,12b")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = ensure_tiny(tmp)
        print(f"torch threads {torch.get_num_threads()}; {args.rows} rows x {args.prompt}-token prompts, "
              f"{args.steps} decode steps, {args.reps} reps (median)")
        print(f"{'model':6} {'prefill ms on / off':>22} {'ratio':>6} {'decode ms on / off':>22} {'ratio':>6}")
        for name in args.models.split(","):
            engines = {m: build(dirs[NAMES[name]], m) for m in (True, False)}
            assert engines[True].media is not None and engines[False].media is None
            runs = {m: [] for m in engines}
            for _ in range(args.reps + 1):  # the first is a warm-up
                for m, eng in engines.items():
                    runs[m].append(one_rep(eng, args.rows, args.prompt, args.steps))
            pre = {m: statistics.median(r[0] for r in runs[m][1:]) for m in runs}
            dec = {m: statistics.median(r[1] for r in runs[m][1:]) for m in runs}
            print(f"{name:6} {pre[True]:10.2f} / {pre[False]:9.2f} {pre[True] / pre[False]:6.2f} "
                  f"{dec[True]:10.3f} / {dec[False]:9.3f} {dec[True] / dec[False]:6.2f}")
            for eng in engines.values():
                eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
