"""Speculative decoding (prompt-lookup drafts, MTP drafters) against plain decoding, side by side in one run.

    python bench/spec_decode.py [--k 4] [--tokens 160] [--batches 1,8]

Measured (CPU): a repetitive workload, the E4B-like tiny checkpoint with its attention and MLP outputs zeroed
(every `o_proj` and `down_proj`), so its next token depends on the current token only and greedy output falls
into a cycle within a few dozen tokens: the text a prompt-lookup drafter predicts well (code edits, JSON and
agents quoting their context repeat less). B rows decode `--tokens` greedy tokens each, with and without
`speculative_method: ngram` (k drafts a step); printed: tokens per target step (decode or verify call), tok/s
and their ratios; the tokens must be equal.

MTP (`draft_model`) on CPU: the 12B-like tiny with the same zeroed outputs (its next token is its current one)
with two drafters: one that copies that target (`testing.tiny_assistant.write_copying_assistant`: every draft
accepted, the upper bound of what the machinery gains) and a random one (drafts rejected: the lower bound, k
wasted draft steps a round). Random weights cannot stand for a trained drafter; the two bound it.

Projected (inf2, not measured): a step costs max(bytes read / HBM bandwidth, FLOPs / tensor-engine peak) per
NeuronCore (about 410 GB/s and 95 bf16 TFLOPS, derived from the inf2 chip figures). Decode reads the weights
and the KV cache (`compile plan`'s bytes, bf16, the configs/inf2.yaml shapes) for B tokens; a verify step
(T = k + 1 positions a row) reads the same bytes plus its per-position candidates for B x T tokens (2 FLOPs a
weight a token). Per-stream speedup = acceptance length x decode time / verify time, at 1.5 / 2.5 / 3.5.
MTP adds k draft steps a round: speedup = acceptance length x decode / (verify + k x draft). A draft step reads
the drafter's weights and the K/V of the target's two store layers; the published assistants' sizes are not in
our references, so the drafter's weights are taken as 2 / 5 / 10 % of the target's per-core weight bytes.
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


def mtp_checkpoints() -> tuple[Path, Path, Path]:
    """The looping 12B-like target, a drafter that copies it and a random one."""
    from safetensors.torch import load_file, save_file

    from neuron_workers.testing.tiny import ensure_tiny
    from neuron_workers.testing.tiny_assistant import write_copying_assistant, write_tiny_assistant

    tmp = Path(tempfile.gettempdir())
    src = ensure_tiny(tmp / "gemma4-bench-tiny")["gemma4-12b-tiny"]
    out = tmp / "gemma4-bench-12b-looping"
    if not (out / "model.safetensors").is_file():
        shutil.copytree(src, out, dirs_exist_ok=True)
        t = load_file(str(src / "model.safetensors"))
        t = {k: v * 0 if k.endswith(("o_proj.weight", "down_proj.weight")) else v for k, v in t.items()}
        save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return (out, write_copying_assistant(out, tmp / "gemma4-bench-12b-copying-assistant"),
            write_tiny_assistant(out, tmp / "gemma4-bench-12b-random-assistant"))


def run(path: Path, batch: int, tokens: int, k: int, draft: Path | None = None
        ) -> tuple[list[list[int]], float, int]:
    eng = build_engine(EngineConfig(model=str(path), max_context=CTX, max_batch=batch, prefill_buckets=(32,),
                                    speculative_method="ngram" if k and not draft else None,
                                    num_speculative_tokens=k or None, draft_model=str(draft) if draft else None))
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
        kv = mtp_kv_bytes(dims, batch, ctx, plan.tp)
        for frac in (0.02, 0.05, 0.10):
            draft = (frac * plan.weights_per_core + kv) / HBM_BYTES_S
            gains = "  ".join(f"tau {tau}: {tau * decode / (verify + k * draft):.2f}x" for tau in (1.5, 2.5, 3.5))
            print(f"    MTP, drafter {frac:.0%} of the weights: draft step {draft * 1e3:.2f} ms; {gains}")


def mtp_kv_bytes(dims, batch: int, ctx: int, tp: int) -> int:
    """Bytes of target K/V one draft step reads a core (bf16): the full store layer's context, the sliding one's
    window + 1, for every row."""
    from neuron_workers.model.assistant import store_layers
    from neuron_workers.model.dims import FULL

    total = 0
    for t, layer in store_layers(dims).items():
        n = ctx if t == FULL else dims.sliding_window + 1
        heads = max(1, dims.kv_heads[layer] // tp)
        total += 2 * batch * heads * n * dims.head_dims[layer] * 2
    return total


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
    target, copying, random = mtp_checkpoints()
    for b in (int(x) for x in args.batches.split(",")):
        plain, t_plain, s_plain = run(target, b, args.tokens, 0)
        n = b * (args.tokens - 1)
        line = f"B={b} MTP (12B-like looping): plain {n / t_plain:7.1f} tok/s"
        for label, draft in (("copying drafter", copying), ("random drafter", random)):
            got, t, steps = run(target, b, args.tokens, args.k, draft)
            line += (f"; {label} {n / steps / b:.2f} tokens per target step a row, {n / t:7.1f} tok/s, "
                     f"{t_plain / t:.2f}x, {'same tokens' if got == plain else 'DIFFERENT TOKENS'}")
        print(line)
    projection(args.k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
