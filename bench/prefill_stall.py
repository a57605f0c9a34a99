"""The stall a long prompt puts on running streams, with and without chunked prefill, side by side in one run.

    python bench/prefill_stall.py [--dims tiny|12b|both] [--chunk N] [--repeat 3] [--threads 1] [--mtp K]

Two streams decode; then a prompt of most of the context arrives. Per engine step the wall time is kept; the script
prints the median decode step before the arrival, the longest step while the long prompt is being prefilled (until
its first token), their ratio (goal with chunks: <= 2x), and the long prompt's time to first token, for
`prefill_chunk` 0 (the whole prompt in one step) and N, N both as two graphs a step (the chunk's extend graph,
then the decode step) and as one (the mixed graph: the chunk beside the decode tokens). The longest of the decode
steps before the arrival is printed too (the box's noise floor), and the 95th percentile of the steps while the
prompt is prefilled. Each mode is measured `--repeat` times, the modes taking turns (so a slow spell of the box
falls on all of them); every repeat's longest step is printed and the least of them, the stall that every repeat
shows (a step that takes the whole prompt is in every repeat; a descheduled process is not). The first tokens of the
modes are compared. `tiny`: the E4B-like tiny checkpoint, context 1024, prompt 1000 (chunk at most its ring, 16).
`12b`: random bf16 weights at the real 12B widths (hidden 3840, 16 query heads, head_dim 256 / 512, vocab 262,144,
window 1024) but 2 layers (one sliding, one full: the full 48 would not fit this box's RAM), context 1024, prompt
1000. `--mtp K` (tiny only): the streams speculate with a tiny random MTP drafter, K drafts a round, so a step
before the arrival is K draft steps and a verify; while the prompt prefills, "2 graphs" is the chunk's extend
graph then the drafts and the verify, "mixed" the mixed graph's `_h` variant (every row one token, no drafts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_workers.backends.cpu import CpuBackend  # noqa: E402
from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.engine.engine import Engine  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.factory import build_engine  # noqa: E402
from neuron_workers.model.dims import ModelDims  # noqa: E402

CTX, PROMPT = 1024, 1000


def model_12b(layers: int = 2):
    """A 12B-wide text model with random bf16 weights (`layers` layers, sliding then full)."""
    import transformers as tf

    from neuron_workers.model.attention import NAME
    from neuron_workers.model.checkpoint import _materialize_buffers

    d = json.loads((ROOT / "configs/model-configs/gemma-4-12B.text_config.json").read_text())
    d.pop("model_type")
    d["num_hidden_layers"] = layers
    d["layer_types"] = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    for key in ("kv_sharing_modes", "num_kv_shared_layers"):
        d.pop(key, None)
    cfg = tf.Gemma4UnifiedTextConfig(**d)
    torch.manual_seed(0)
    with torch.device("meta"):
        lm = tf.Gemma4UnifiedForCausalLM(cfg)
    lm = lm.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for p in lm.parameters():
            p.normal_(0, 0.02)
    for layer in lm.model.layers:  # a persistent buffer (a checkpoint sets it): to_empty left it uninitialised
        layer.layer_scalar.fill_(1.0)
    _materialize_buffers(lm, cfg)  # RoPE tables and scales that to_empty left unset
    lm.lm_head.weight = lm.model.embed_tokens.weight
    lm.config._attn_implementation = NAME
    dims = ModelDims.from_hf(cfg)
    info = SimpleNamespace(sampling_defaults={}, model_dir="12b-standin", eos_token_ids=())
    return SimpleNamespace(info=info, dims=dims, hf_lm=lm.eval(), ple=None, tokenizer=None, eos_token_ids=())


MODES = ((0, False), (1, False), (1, True))  # (chunked, mixed): whole prompts, two graphs a step, the mixed graph


def engines(which: str, chunk: int | None, mtp: int = 0):
    out = []
    if which == "tiny":
        from neuron_workers.testing.tiny import ensure_tiny
        from neuron_workers.testing.tiny_assistant import write_tiny_assistant

        d = ensure_tiny(Path(tempfile.gettempdir()) / "gemma4-bench-tiny")["gemma4-e4b-tiny"]
        draft = {}
        if mtp:
            out_dir = Path(tempfile.mkdtemp(prefix="gemma4-bench-drafter-"))
            draft = {"draft_model": str(write_tiny_assistant(d, out_dir, seed=1)), "num_speculative_tokens": mtp}
        for chunked, mixed in MODES:
            # no prefix cache: the warm-up's prompt is the long one's start
            eng = build_engine(EngineConfig(model=str(d), max_context=CTX, max_batch=3, prefill_chunk=chunk * chunked,
                                            prefix_cache=False, **draft))
            eng.mixed_steps = mixed
            out.append(eng)
        return out
    model = model_12b()
    for chunked, mixed in MODES:
        c = chunk * chunked
        backend = CpuBackend(model.hf_lm, model.dims, CTX, (32, 64, 128, 256, 512, CTX), torch.bfloat16, max_batch=3)
        backend.extend_buckets = (c,) if c else ()
        eng = Engine(model, backend, prefill_chunk=c)
        eng.mixed_steps = mixed
        out.append(eng)
    return out


def run(eng, long_prompt, n_stream: int = 24, warm: int = 4):
    p = SamplingParams
    streams = [eng.new_sequence([2, 5 + i, 9, 11], p(max_tokens=CTX - 10, ignore_eos=True)) for i in range(2)]
    long = eng.new_sequence(long_prompt, p(max_tokens=1, ignore_eos=True))
    for s in streams:
        eng.add(s)
    before, during, tokens = [], [], []
    for i in range(warm + n_stream):  # decode steps alone (the first ones prefill the streams: not counted)
        t = time.perf_counter()
        eng.step()
        if i >= warm:
            before.append(time.perf_counter() - t)
    eng.add(long)
    t0 = time.perf_counter()
    while not long.output_ids:
        t = time.perf_counter()
        for ev in eng.step():
            tokens.append((ev.seq_id, ev.token_id))
        during.append(time.perf_counter() - t)
    ttft = time.perf_counter() - t0
    for s in streams:
        eng.cancel(s.seq_id)
    p95 = sorted(during)[int(0.95 * (len(during) - 1))]
    return (statistics.median(before), max(before), max(during), p95, statistics.median(during), len(during), ttft,
            long.output_ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", choices=["tiny", "12b", "both"], default="both")
    ap.add_argument("--chunk", type=int, help="prefill_chunk to compare with 0 (default: 16 at tiny, the ring; "
                    "32 at 12b)")
    ap.add_argument("--repeat", type=int, default=3, help="measurements of each mode, taking turns (default 3)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mtp", type=int, default=0, metavar="K", help="tiny only: the streams speculate with a tiny "
                    "MTP drafter, K drafts a round (default 0: plain decoding)")
    args = ap.parse_args(argv)
    if args.mtp and args.dims != "tiny":
        ap.error("--mtp needs --dims tiny (no drafter at the 12B widths here)")
    torch.set_num_threads(args.threads)
    prompt = [2] + [(7 * i + 3) % 500 + 5 for i in range(PROMPT - 1)]
    for which in (["tiny", "12b"] if args.dims == "both" else [args.dims]):
        engs = engines(which, args.chunk or (16 if which == "tiny" else 32), args.mtp)
        for eng in engs:
            run(eng, prompt[:100], 2, 2)  # every graph built and used once (eager graphs are made on first use)
        rows = [[run(eng, prompt) for eng in engs] for _ in range(max(1, args.repeat))]
        for eng, runs in zip(engs, zip(*rows)):
            report(which, eng, runs)
        firsts = {tuple(r[-1]) for per_mode in rows for r in per_mode}
        print(f"{which}: first token equal in every mode and repeat: {len(firsts) == 1}")
    return 0


def report(which: str, eng, runs) -> None:
    """One line per repeat of one mode, then the least longest step over the repeats."""
    how = ("mixed" if eng.mixed_steps else "2 graphs") if eng.prefill_chunk else "whole"
    mtp = f" MTP K={eng.spec_k}" if eng.spec_k else ""
    label = f"{which}{mtp}: prefill_chunk {eng.prefill_chunk or 'off':>4} ({how:>8})"
    for med, floor, worst, p95, med_during, steps, ttft, _ in runs:
        step = "speculative" if mtp else "decode"
        print(f"{label}: {step} step median {med * 1e3:7.1f} ms (longest {floor / med:4.2f}x); while a "
              f"{PROMPT}-token prompt prefills: longest step {worst * 1e3:8.1f} ms = {worst / med:6.2f}x (gap "
              f"{(worst - med) * 1e3:7.1f} ms), p95 {p95 / med:5.2f}x, median {med_during / med:5.2f}x, {steps} "
              f"steps, its TTFT {ttft:6.2f} s")
    ratios = [r[2] / r[0] for r in runs]
    print(f"{label}: longest step over {len(runs)} repeats: least {min(ratios):.2f}x, most {max(ratios):.2f}x; "
          f"median step {statistics.median(r[4] / r[0] for r in runs):.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
