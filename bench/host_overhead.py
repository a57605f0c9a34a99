"""Host time per decode step at the real E2B sizes, with a stand-in for the graph call.

    python bench/host_overhead.py [--steps 200] [--threads 1] [--batches 1,8,16,32] [--penalties]

Everything the engine does per decode step except the device call: the PLE gather from the memory-mapped
table (real E2B shape: 262,144 x 35*256, bf16, a sparse file so no 4.7 GB is written) for every row, the
decode inputs (masks, ids, positions), per-row sampling on 262,144-wide bf16 logits (greedy, and T / top-k
64 / top-p with the soft-cap in fp32, each row with its own generator), stop checks and incremental
detokenization. Rows: B=1 greedy, B=1 sampled, and B=8/16/32 mixed (half greedy, half sampled with
different temperatures, top-p and seeds). The stand-in graph returns precomputed outputs; its own cost is
measured and subtracted. Two host paths, side by side:
  candidates  what the engine runs: the `decode` graph's top-256 values + ids per row (bf16 / int32)
  logits      the `decode_logits` graph's full [B, 262144] bf16 logits (what every step returned before;
              still the path of a step where some row needs the whole distribution)
Prints ms per step and the ratio to the goal of the candidates path (0.25 ms B=1 greedy, 0.5 ms B=1
sampled, 2 ms at B=8/16/32; <= 1.0 meets it).
With --penalties, instead: the sampler alone on one step's full bf16 logits (the path penalized rows need), the
rows above plain and again with repetition 1.1, frequency 0.5 and presence 0.5, side by side: the extra ms per
penalized row and its ratio to the goal of 0.25 ms (the penalties touch only the ids they change,
`engine/penalties.py`; capping and penalizing the whole vocabulary costs about 1.4 ms a row).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from standin import KEY, LAYERS, PLE_DIM, VOCAB, StandInBackend, StandInDims, sparse_ple_file  # noqa: E402

from neuron_workers.engine.engine import Engine  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.model.ple import PleTable  # noqa: E402

K = 256
GOAL_MS = {"greedy": 0.25, "sampled": 0.5, "mixed": 2.0}


def per_step_ms(engine, params: list[SamplingParams], steps: int) -> float:
    seqs = [engine.new_sequence(list(range(2, 66)), p) for p in params]
    for seq in seqs:
        engine.add(seq)
    engine.step()  # prefill every row
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    ms = (time.perf_counter() - t) * 1e3 / steps
    for seq in seqs:
        engine.cancel(seq.seq_id)
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,8,16,32")
    ap.add_argument("--penalties", action="store_true",
                    help="instead: the sampler alone, plain rows beside the same rows with penalties")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from neuron_workers.testing.tiny_tokenizer import build_tokenizer

    n = 3 * args.steps + 60
    greedy = SamplingParams(max_tokens=n, ignore_eos=True)
    mix = [(1.0, 0.95), (0.7, 0.9), (1.2, 1.0), (0.9, 0.5)]
    sampled = [SamplingParams(max_tokens=n, temperature=t, top_k=64, top_p=p, seed=i, ignore_eos=True)
               for i, (t, p) in enumerate(mix * 4)]
    rows = {}
    for b in map(int, args.batches.split(",")):
        if b == 1:
            rows["B=1 greedy"] = (1, [greedy], "greedy")
            rows["B=1 sampled (T=1, top_k=64, top_p=0.95)"] = (1, sampled[:1], "sampled")
        else:
            rows[f"B={b} mixed ({b // 2} greedy + {b // 2} sampled, own seeds)"] = (
                b, [greedy] * (b // 2) + sampled[: b - b // 2], "mixed")
    with tempfile.TemporaryDirectory() as tmp:
        path = sparse_ple_file(Path(tmp) / "ple.safetensors")
        ple = PleTable(path, KEY, LAYERS, PLE_DIM, torch.bfloat16)

        class Model:
            dims, tokenizer, eos_token_ids = StandInDims, build_tokenizer(), (1, 106, 50)
            info = type("info", (), {"model_dir": "stand-in", "sampling_defaults": {}})

        Model.ple = ple
        if args.penalties:
            return penalties_table(rows, args.steps)
        print(f"E2B host side: vocab {VOCAB:,}, PLE {LAYERS}x{PLE_DIM} bf16 (mmap), "
              f"{torch.get_num_threads()} thread(s); ms of host work per decode step")
        print(f"{'rows':46s} {'candidates':>10s} {'logits':>8s}   ratio to goal (candidates; <= 1.0 meets it)")
        for label, (batch, params, kind) in rows.items():
            ms = {}
            for cands in (True, False):
                backend = StandInBackend(batch, K if cands else 0, favour=True)
                engine = Engine(Model, backend)
                fn = backend.decode_candidates if cands else backend.decode
                stand_in = min(timeit(fn) for _ in range(3))
                per_step_ms(engine, params, 10)  # warm
                ms[cands] = min(per_step_ms(engine, params, args.steps) for _ in range(3)) - stand_in
            goal = GOAL_MS[kind]
            print(f"{label:46s} {ms[True]:10.3f} {ms[False]:8.3f}   {ms[True] / goal:.2f} (goal {goal} ms)")
    return 0


def penalties_table(rows: dict, steps: int) -> int:
    """The sampler alone (`sampling.sample_rows` on one step's full bf16 logits [B, 262144]), plain rows and the
    same rows with penalties side by side: the whole engine step would mix in the PLE table's page faults, which
    depend on which ids a row visits (penalized rows visit more), not on the penalties."""
    from dataclasses import replace

    from neuron_workers.engine.penalties import Penalties
    from neuron_workers.engine.sampling import Row, make_generator, sample_rows

    g = torch.Generator().manual_seed(0)
    print(f"E2B sampler, rows with penalties: vocab {VOCAB:,}, {torch.get_num_threads()} thread(s); ms per step of "
          "sampling on full bf16 logits; each penalized row: 64 prompt ids, 300 output ids seen")
    print(f"{'rows':46s} {'plain':>8s} {'penalized':>10s} {'extra/row':>10s}   ratio to goal (0.25 ms a row)")
    for label, (batch, params, _) in rows.items():
        logits = (torch.randn(batch, VOCAB, generator=g) * 4).to(torch.bfloat16)
        penalized = [replace(p, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5) for p in params]
        ms = {}
        for name, ps in (("plain", params), ("penalized", penalized)):
            pens = [Penalties(p, list(range(2, 66)), VOCAB) if p.penalized else None for p in ps]
            for pen in filter(None, pens):
                for t in torch.randint(0, VOCAB, (300,), generator=g).tolist():
                    pen.add(t)
            made = [Row(i, p, make_generator(i), None, None, pen) for i, (p, pen) in enumerate(zip(ps, pens))]
            sample_rows(logits, made, 30.0)  # warm
            ms[name] = min(_timed(lambda z=logits, r=made: sample_rows(z, r, 30.0), steps) for _ in range(3))
        extra = (ms["penalized"] - ms["plain"]) / batch
        print(f"{label:46s} {ms['plain']:8.3f} {ms['penalized']:10.3f} {extra:10.3f}   {extra / 0.25:.2f}")
    return 0


def _timed(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) * 1e3 / n


def timeit(fn, n=1000) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn(None)
    return (time.perf_counter() - t) * 1e3 / n


if __name__ == "__main__":
    sys.exit(main())
