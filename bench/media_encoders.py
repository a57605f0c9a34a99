"""What Gemma-4's media encoders cost on the host CPU, at real size: params, bytes, soft tokens, ms and GFLOPs per item.

    nice -n 10 python bench/media_encoders.py [--sizes e2b,e4b,12b] [--media image,audio] [--dtypes fp32,bf16]
                                               [--budgets 70,280] [--seconds 1,10,30] [--reps 2] [--no-flops]

Random weights, built from transformers' own classes with the real configs (transformers 5.23's defaults for
`Gemma4VisionConfig` / `Gemma4AudioConfig` / `Gemma4Unified{Vision,Audio}Config` ARE the shipped values: the
parameter counts printed here, 167.4M / 304.8M / 3.5M / 5.9M / 52.4M, match the checkpoints'):
- E2B / E4B (`gemma4`): `Gemma4VisionModel` (patch embedder, 16-layer encoder, 3x3 pooler) + `embed_vision`, and
  `Gemma4AudioModel` (conv subsampling, 12-layer conformer) + `embed_audio`. The towers are the same in both sizes;
  only the embedders differ (into width 1536 / 2560), so a tower is timed once per input and each size's row is
  tower ms + its embedder ms (both measured).
- 12B (`gemma4_unified`): encoder-free `Gemma4UnifiedVisionEmbedder` (48x48 patches -> LN/Dense/LN/posemb/LN ->
  RMSNorm/Linear into 3840) and the audio `Gemma4UnifiedMultimodalEmbedder` (640-sample frames -> 3840).

The default run (3-6 minutes on 2 shared cores) leaves out the largest image budget; docs/performance.md's table is
`--budgets 70,280,1120` (9-20 minutes, by the box's load: one 1120-token image is 1-2 min of fp32 on 2 cores).

Inputs are what transformers' own processors make: `Gemma4ImageProcessorPil` for one 1024x768 image at each
`max_soft_tokens` budget (70 .. 1120 allowed; 280 is the default), `Gemma4AudioFeatureExtractor` /
`Gemma4UnifiedAudioFeatureExtractor` for 1 / 10 / 30 s of 16 kHz audio (30 s is the extractors' max_length).
torchvision is not installed here, so the 12B's 3x3 patch merge is transformers' own `patches_merge` lifted out of
`image_processing_gemma4_unified.py` (its module imports torchvision at the top; the function does not use it).

Each row: ms per item (median of --reps after one warm-up; torch threads = the box's cores, printed), the encoder's
GFLOPs per item (torch.utils.flop_counter, on the first --dtypes run, plus the vision tower's sdpa attention,
which the counter misses on CPU: `vision_attention_gflops`), and beside it the GFLOPs of a text prefill of the same
number of tokens through that size's decoder layers (2 x decoder-layer params x tokens, params from
docs/reference counts; attention scores not counted), so "an image costs X% of prefilling its soft tokens".
No Neuron timing is made or implied.
"""

from __future__ import annotations

import argparse
import ast
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode
from transformers.models.gemma4 import configuration_gemma4 as c4
from transformers.models.gemma4 import modeling_gemma4 as m4
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.models.gemma4_unified import configuration_gemma4_unified as cu
from transformers.models.gemma4_unified import modeling_gemma4_unified as mu
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor

TEXT_HIDDEN = {"e2b": 1536, "e4b": 2560, "12b": 3840}
# Decoder-layer parameters per size (docs: gemma4-architecture.md section 1.2, "decoder layers" row).
DECODER_LAYER_PARAMS = {"e2b": 1_863_341_568, "e4b": 3_945_824_512, "12b": 10_900_713_472}
BUDGETS = (70, 140, 280, 560, 1120)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SAMPLE_RATE = 16_000
SLOW_S = 10.0


@dataclass
class Row:
    size: str
    item: str
    dtype: str
    params: int
    soft_tokens: int
    ms: float
    gflops: float | None


def n_params(*mods: torch.nn.Module) -> int:
    return sum(p.numel() for m in mods for p in m.parameters())


def _patches_merge():
    """transformers' own `patches_merge`, read out of its module without importing torchvision."""
    import transformers.models.gemma4_unified as pkg

    src = Path(pkg.__file__).with_name("image_processing_gemma4_unified.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "patches_merge")
    scope = {"torch": torch, "math": math}
    exec(compile(ast.Module([fn], []), "patches_merge", "exec"), scope)  # noqa: S102 - transformers' own source
    return scope["patches_merge"]


def image_inputs(budget: int) -> dict:
    """One 1024x768 RGB image through Gemma4ImageProcessorPil at `max_soft_tokens=budget`."""
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (768, 1024, 3), dtype=np.uint8))
    out = Gemma4ImageProcessorPil(max_soft_tokens=budget)(images=[img], return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "pixel_position_ids": out["image_position_ids"],
            "soft": int(out["num_soft_tokens_per_image"][0])}


def unified_image_inputs(e_inputs: dict, budget: int) -> dict:
    """The 12B's input for the same image: 16px patches merged 3x3 into 48px ones, padded to the budget."""
    pv, pos = e_inputs["pixel_values"][0], e_inputs["pixel_position_ids"][0]
    valid = (pos != -1).all(-1)
    soft = int(valid.sum()) // 9
    merged, mpos = _patches_merge()(pv[valid][None], pos[valid][None], soft)
    pad = budget - soft
    merged = torch.nn.functional.pad(merged, (0, 0, 0, pad))
    mpos = torch.nn.functional.pad(mpos, (0, 0, 0, pad), value=-1)
    return {"pixel_values": merged, "image_position_ids": mpos, "soft": soft}


def audio_wave(seconds: float) -> np.ndarray:
    return np.random.default_rng(1).standard_normal(int(seconds * SAMPLE_RATE)).astype(np.float32) * 0.1


def e_audio_inputs(seconds: float) -> dict:
    out = Gemma4AudioFeatureExtractor()([audio_wave(seconds)], sampling_rate=SAMPLE_RATE, return_tensors="pt")
    return {"input_features": out["input_features"], "attention_mask": out["input_features_mask"]}


def u_audio_inputs(seconds: float) -> dict:
    out = Gemma4UnifiedAudioFeatureExtractor()([audio_wave(seconds)], return_tensors="pt")
    return {"input_features": out["input_features"], "soft": int(out["input_features_mask"].sum())}


def timed(fn, reps: int) -> float:
    """Median ms of `reps` runs of fn() after one warm-up (a single run when the warm-up took > SLOW_S)."""
    return timed_out(fn, reps)[0]


def timed_out(fn, reps: int):
    """(median ms, fn's last output)."""
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = fn()
        if time.perf_counter() - t0 > SLOW_S:  # a slow item (the 1120 budget on 2 cores): one timed run is enough
            reps = 1
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def gflops(fn) -> float:
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        fn()
    return counter.get_total_flops() / 1e9


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def vision_attention_gflops(cfg, patches: int) -> float:
    """The vision tower's attention matmuls (QK^T and AV over every patch, padding included: 4 N^2 d a layer).
    flop_counter does not count the CPU sdpa kernel the tower runs by default; this equals the difference between
    its eager and sdpa counts (checked on a one-layer tower: 1.22 GFLOPs at 630 patches)."""
    return 4 * patches**2 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers / 1e9


def run_tower(fn, reps: int, flops: bool):
    """(the tower's output, its ms, its GFLOPs or None)."""
    ms, out = timed_out(fn, reps)
    return out, ms, gflops(fn) if flops else None


def embed_costs(embeds: dict, h: torch.Tensor, reps: int, flops: bool) -> dict:
    """size -> (ms, GFLOPs or None) of that size's multimodal embedder on the tower's output `h`."""
    out = {}
    for s, emb in embeds.items():
        fn = lambda emb=emb: emb(h)  # noqa: E731
        out[s] = (timed(fn, reps), gflops(fn) if flops else None)
    return out


def cast(inputs: dict, dtype: torch.dtype) -> dict:
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}


def bench_e_vision(sizes, dtype_name, budgets, reps, flops) -> list[Row]:
    dtype = DTYPES[dtype_name]
    vcfg = c4.Gemma4VisionConfig()
    tower = m4.Gemma4VisionModel(vcfg).eval().to(dtype)
    embeds = {s: m4.Gemma4MultimodalEmbedder(vcfg, c4.Gemma4TextConfig(hidden_size=TEXT_HIDDEN[s])).eval().to(dtype)
              for s in sizes}
    rows = []
    for budget in budgets:
        progress(f"E vision tower, image@{budget}, {dtype_name}")
        inp = image_inputs(budget)
        kw = cast({k: v for k, v in inp.items() if k != "soft"}, dtype)
        h, tower_ms, tower_gf = run_tower(lambda kw=kw: tower(**kw).last_hidden_state, reps, flops)
        if flops:
            tower_gf += vision_attention_gflops(vcfg, kw["pixel_values"].shape[-2])
        for s, (emb_ms, emb_gf) in embed_costs(embeds, h, reps, flops).items():
            gf = tower_gf + emb_gf if flops else None
            rows.append(Row(s, f"image@{budget}", dtype_name, n_params(tower, embeds[s]), inp["soft"],
                            tower_ms + emb_ms, gf))
    return rows


def bench_e_audio(sizes, dtype_name, seconds, reps, flops) -> list[Row]:
    dtype = DTYPES[dtype_name]
    acfg = c4.Gemma4AudioConfig()
    tower = m4.Gemma4AudioModel(acfg).eval().to(dtype)
    embeds = {s: m4.Gemma4MultimodalEmbedder(acfg, c4.Gemma4TextConfig(hidden_size=TEXT_HIDDEN[s])).eval().to(dtype)
              for s in sizes}
    rows = []
    for sec in seconds:
        progress(f"E audio tower, {sec:g} s, {dtype_name}")
        kw = cast(e_audio_inputs(sec), dtype)
        out, tower_ms, tower_gf = run_tower(lambda kw=kw: tower(**kw), reps, flops)
        soft = int(out.attention_mask.sum())
        for s, (emb_ms, emb_gf) in embed_costs(embeds, out.last_hidden_state, reps, flops).items():
            gf = tower_gf + emb_gf if flops else None
            rows.append(Row(s, f"audio {sec:g}s", dtype_name, n_params(tower, embeds[s]), soft, tower_ms + emb_ms, gf))
    return rows


def bench_u(dtype_name, media, budgets, seconds, reps, flops) -> list[Row]:
    dtype = DTYPES[dtype_name]
    tcfg = cu.Gemma4UnifiedTextConfig(hidden_size=TEXT_HIDDEN["12b"])
    rows = []
    if "image" in media:
        vis = mu.Gemma4UnifiedVisionEmbedder(cu.Gemma4UnifiedVisionConfig(), tcfg).eval().to(dtype)
        for budget in budgets:
            inp = unified_image_inputs(image_inputs(budget), budget)
            kw = cast({k: v for k, v in inp.items() if k != "soft"}, dtype)
            fn = lambda kw=kw: vis(**kw, return_dict=True).pooler_output  # noqa: E731
            rows.append(Row("12b", f"image@{budget}", dtype_name, n_params(vis), inp["soft"], timed(fn, reps),
                            gflops(fn) if flops else None))
    if "audio" in media:
        aud = mu.Gemma4UnifiedMultimodalEmbedder(cu.Gemma4UnifiedAudioConfig(), tcfg).eval().to(dtype)
        for sec in seconds:
            inp = u_audio_inputs(sec)
            x = inp["input_features"].to(dtype)
            fn = lambda x=x: aud(x)  # noqa: E731
            rows.append(Row("12b", f"audio {sec:g}s", dtype_name, n_params(aud), inp["soft"], timed(fn, reps),
                            gflops(fn) if flops else None))
    return rows


def print_table(rows: list[Row]) -> None:
    flops_by_key = {(r.size, r.item): r.gflops for r in rows if r.gflops is not None}
    head = (f"{'size':<4} {'item':<11} {'dtype':<5} {'params':>8} {'MB bf16':>8} {'soft tok':>8} {'ms/item':>9} "
            f"{'ms/tok':>7} {'GFLOPs':>8} {'prefill GFLOPs':>14} {'enc/prefill':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        gf = flops_by_key.get((r.size, r.item))
        prefill = 2 * DECODER_LAYER_PARAMS[r.size] * r.soft_tokens / 1e9
        gf_s = f"{gf:8.1f}" if gf is not None else f"{'-':>8}"
        ratio = f"{gf / prefill:10.1%}" if gf is not None else f"{'-':>10}"
        print(f"{r.size:<4} {r.item:<11} {r.dtype:<5} {r.params / 1e6:7.1f}M {r.params * 2 / 1e6:8.1f} "
              f"{r.soft_tokens:8d} {r.ms:9.1f} {r.ms / max(r.soft_tokens, 1):7.2f} {gf_s} {prefill:14.1f} {ratio:>11}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="e2b,e4b,12b", help="comma list of e2b,e4b,12b")
    p.add_argument("--media", default="image,audio", help="comma list of image,audio")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32,bf16")
    p.add_argument("--budgets", default="70,280", help=f"image max_soft_tokens, any of {BUDGETS} (280 = default)")
    p.add_argument("--seconds", default="1,10,30", help="audio lengths in seconds (<= 30)")
    p.add_argument("--reps", type=int, default=2,
                   help=f"timed runs per item after one warm-up (1 if that took > {SLOW_S:g} s)")
    p.add_argument("--no-flops", action="store_true", help="skip the FLOP count")
    args = p.parse_args(argv)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.media = [m for m in args.media.split(",") if m]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.budgets = [int(b) for b in args.budgets.split(",") if b]
    args.seconds = [float(s) for s in args.seconds.split(",") if s]
    bad = ([s for s in args.sizes if s not in TEXT_HIDDEN] + [m for m in args.media if m not in ("image", "audio")]
           + [d for d in args.dtypes if d not in DTYPES] + [str(b) for b in args.budgets if b not in BUDGETS]
           + [f"{s:g}s" for s in args.seconds if not 0 < s <= 30])
    if bad:
        p.error(f"unknown or out-of-range value(s): {', '.join(bad)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, torch threads "
          f"{torch.get_num_threads()} (host CPU), reps {args.reps} (median, after one warm-up)")
    e_sizes = [s for s in args.sizes if s in ("e2b", "e4b")]
    rows: list[Row] = []
    for dt in args.dtypes:
        flops = not args.no_flops and dt == args.dtypes[0]  # FLOPs do not depend on the dtype: count once
        if e_sizes and "image" in args.media:
            rows += bench_e_vision(e_sizes, dt, args.budgets, args.reps, flops)
        if e_sizes and "audio" in args.media:
            rows += bench_e_audio(e_sizes, dt, args.seconds, args.reps, flops)
        if "12b" in args.sizes:
            rows += bench_u(dt, args.media, args.budgets, args.seconds, args.reps, flops)
    rows.sort(key=lambda r: (list(TEXT_HIDDEN).index(r.size), r.item.split()[0][:5], r.dtype != "fp32"))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
