"""Speculative decoding with prompt-lookup drafts against plain decoding, side by side in one run.

    python bench/spec_decode.py [--k 4] [--tokens 160] [--batches 1,8]

Measured (CPU): a repetitive workload, the E4B-like tiny checkpoint with its attention and MLP outputs zeroed
(every `o_proj` and `down_proj`), so its next token depends on the current token only and greedy output falls
into a cycle within a few dozen tokens: the text a prompt-lookup drafter predicts well (code edits, JSON and
agents quoting their context repeat less). B rows decode `--tokens` greedy tokens each, with and without
`speculative_method: ngram` (k drafts a step); printed: tokens per target step (decode or verify call), tok/s
and their ratios; the tokens must be equal.

Projected (inf2, not measured): a step costs max(bytes read / HBM bandwidth, FLOPs / tensor-engine peak) per
NeuronCore (about 410 GB/s and 95 bf16 TFLOPS, derived from the inf2 chip figures). Decode reads the weights
and the KV cache (`compile plan`'s bytes, bf16, the configs/inf2.yaml shapes) for B tokens; a verify step
(T = k + 1 positions a row) reads the same bytes plus its per-position candidates for B x T tokens (2 FLOPs a
weight a token). Per-stream speedup = acceptance length x decode time / verify time, at 1.5 / 2.5 / 3.5.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.factory import build_engine  # noqa: E402

CTX = 512
HBM_BYTES_S, BF16_FLOPS_S = 410e9, 95e12  # per NeuronCore-v2 (half an Inferentia2 chip)


def looping_checkpoint() -> Path:
    from safetensors.torch import load_file, save_file

    from neuron_workers.testing.tiny import ensure_tiny

    src = ensure_tiny(Path(tempfile.gettempdir()) / "gemma4-bench-tiny")["gemma4-e4b-tiny"]
    out = Path(tempfile.gettempdir()) / "gemma4-bench-e4b-looping"
    if not (out / "model.safetensors").is_file():
        shutil.copytree(src, out, dirs_exist_ok=True)
        t = load_file(str(src / "model.safetensors"))
        t = {k: v * 0 if k.endswith(("o_proj.weight", "down_proj.weight")) else v for k, v in t.items()}
        save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def run(path: Path, batch: int, tokens: int, k: int) -> tuple[list[list[int]], float, int]:
    eng = build_engine(EngineConfig(model=str(path), max_context=CTX, max_batch=batch, prefill_buckets=(32,),
                                    speculative_method="ngram" if k else None, num_speculative_tokens=k or None))
    p = SamplingParams(max_tokens=tokens, ignore_eos=True)
    seqs = [eng.new_sequence([2, 10 + 7 * i, 11 + 3 * i, 12], p) for i in range(batch)]
    for s in seqs:
        eng.add(s)
    eng.step()  # the prefills and the first decode (not timed)
    steps, t0 = 0, time.perf_counter()
    while eng.has_work:
        eng.step()
        steps += 1
    wall = time.perf_counter() - t0
    eng.close()
    return [s.output_ids for s in seqs], wall, steps


def projection(k: int) -> None:
    import yaml

    from compile.plan import config_or_bundled, make_plan_report
    from neuron_workers.model.dims import ModelDims, decode_candidates

    cfg = yaml.safe_load((ROOT / "configs/inf2.yaml").read_text())
    print(f"projected on inf2 (roofline: compile plan bytes at 410 GB/s, 95 TFLOPS a core; k = {k}; not measured):")
    for m in cfg["applications"][0]["args"]["models"]:
        name = Path(m["path"]).name
        text = config_or_bundled(m["path"], note=lambda _: None)
        dims = ModelDims.from_hf(text)
        batch, ctx = m.get("max_batch", 8), m.get("max_context", 4096)
        plan = make_plan_report(text, m.get("tp", 1), batch, ctx, "inf2.48xlarge")
        read = plan.weights_per_core + plan.kv_per_core
        flops = 2 * plan.weights_per_core / 2 * batch  # 2 FLOPs a bf16 weight a token
        decode = max(read / HBM_BYTES_S, flops / BF16_FLOPS_S)
        out = batch * (k + 1) * decode_candidates(dims) * 6 // plan.tp  # bf16 value + int32 id a candidate
        verify = max((read + out) / HBM_BYTES_S, flops * (k + 1) / BF16_FLOPS_S)
        gains = "  ".join(f"tau {tau}: {tau * decode / verify:.2f}x" for tau in (1.5, 2.5, 3.5))
        print(f"  {name} tp={plan.tp} B={batch} ctx={ctx}: decode {decode * 1e3:.1f} ms, verify {verify * 1e3:.1f} ms "
              f"a step; per-stream speedup {gains}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args(argv)
    path = looping_checkpoint()
    for b in (int(x) for x in args.batches.split(",")):
        plain, t_plain, s_plain = run(path, b, args.tokens, 0)
        spec, t_spec, s_spec = run(path, b, args.tokens, args.k)
        n = b * (args.tokens - 1)
        print(f"B={b}: plain {n / s_plain / b:.2f} tokens per step a row, {n / t_plain:7.1f} tok/s; ngram k={args.k}: "
              f"{n / s_spec / b:.2f} tokens per step a row, {n / t_spec:7.1f} tok/s; speedup {t_plain / t_spec:.2f}x; "
              f"{'same tokens' if spec == plain else 'DIFFERENT TOKENS'}")
    projection(args.k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
