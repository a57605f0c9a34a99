"""Bytes moved device -> host per decode step, before (the decode graph returned [B, vocab] bf16 logits)
and after (the `decode` graph returns each row's top-256 bf16 values + int32 ids; `decode_logits` runs
only for steps where a row needs the whole distribution), for the E2B / E4B / 12B vocabularies at
B = 1, 8, 16, 32.

    python bench/device_bytes.py [--batches 1,8,16,32]

Also prints what receiving that output costs this host at least: one copy of those bytes into a fresh
tensor (the runtime's device -> host transfer ends in host memory; the DMA itself comes on top and is
not measured here: no NeuronCore on this machine). The shapes come from `GraphSpec.outputs`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compile.plan import load_text_config  # noqa: E402
from neuron_workers.model.dims import ModelDims, decode_candidates  # noqa: E402
from neuron_workers.model.spec import DECODE, make_spec  # noqa: E402


def head_bytes(spec) -> int:
    """Bytes of the outputs the host receives (everything but the KV buffers, which stay on the device)."""
    heads = spec.outputs[: spec.num_heads]
    return sum(torch.empty((), dtype=t.dtype).element_size() * torch.Size(t.shape).numel() for t in heads)


def copy_ms(nbytes: int, reps: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.empty_like(src).copy_(src)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,16,32")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':5s} {'vocab':>8s} {'B':>3s} | {'before: logits':>16s} {'after: top-K':>14s} {'ratio':>7s} | "
          f"{'per step before':>15s} {'after':>9s} | {'host copy before':>16s} {'after':>8s}")
    for name in ("E2B", "E4B", "12B"):
        cfg = load_text_config(ROOT / "configs" / "model-configs" / f"gemma-4-{name}.text_config.json")
        dims = ModelDims.from_hf(cfg)
        k = decode_candidates(dims)
        for b in map(int, args.batches.split(",")):
            before = head_bytes(make_spec(dims, DECODE, b, 1, 4096, torch.bfloat16, torch.int32))
            after = head_bytes(make_spec(dims, DECODE, b, 1, 4096, torch.bfloat16, torch.int32, candidates=k))
            print(f"{name:5s} {dims.vocab_size:8,d} {b:3d} | {before / b / 1024:9.1f} KiB/row {after / b:8.0f} B/row "
                  f"{before / after:6.0f}x | {before / 2**20:11.1f} MiB {after / 1024:5.1f} KiB | "
                  f"{copy_ms(before):13.3f} ms {copy_ms(after):6.3f} ms")
    print(f"per step = per row x B. K = {k} candidates (bf16 value + int32 id = 6 bytes each).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
