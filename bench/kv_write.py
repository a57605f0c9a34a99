"""The decode step's KV write, old against new, at a real E2B KV shape: B=16 rows, context 4096 (15 KV layers:
12 sliding rings of 512 x 256, 3 full buffers of 4096 x 512; one KV head; bf16), on the cpu backend (eager)
and the xla backend (buffers as module state on the XLA CPU device, one sync per step).

    python bench/kv_write.py [--steps 5] [--batch 16] [--context 4096] [--dtype bfloat16] [--backends cpu,xla]

  where    the old write: torch.where(onehot, new, old) over every whole [B, H, ctx, D] buffer
  scatter  the new write (model.graphs.DecodeKV): torch.scatter of one position per row into the old buffer

Both run the same DecodeKV plumbing over the same buffers and inputs (rows at different positions) and
must give bit-identical buffers. Prints ms per step for each and the ratio where / scatter. Only the write
is timed (no attention, no weights): it is the part of decode the change touches. On these CPU devices both
still copy the buffer (out of place, no aliasing); on inf2, where the runtime aliases the state, the
scatter touches B x H x D elements per buffer and the select all of it, so the gap there is larger still.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuron_workers.model.dims import ModelDims  # noqa: E402
from neuron_workers.model.graphs import DecodeKV  # noqa: E402
from neuron_workers.model.spec import kv_specs  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "model-configs" / "gemma-4-E2B.text_config.json"


class WhereKV(DecodeKV):
    """The decode write before issue 17: a one-hot select over the whole buffer."""

    def update(self, k, v, layer_idx, *args, **kwargs):
        j = self.index[layer_idx]
        n = self.kv[j].shape[2]
        hot = (torch.arange(n, device=k.device)[None, :] == self.pos % n)[:, None, :, None]
        self.kv[j], self.kv[j + 1] = torch.where(hot, k, self.kv[j]), torch.where(hot, v, self.kv[j + 1])
        return self.kv[j], self.kv[j + 1]


class KvState(torch.nn.Module):
    """The KV buffers as registered state, replaced each step by `cls`'s write (as graph_model does)."""

    def __init__(self, dims, specs, cls, in_place: bool = False):
        super().__init__()
        self.dims, self.cls, self.names = dims, cls, [f"kv{i}" for i in range(len(specs))]
        self.in_place = in_place  # copy_ into the old buffer: torch-xla then aliases it (donates the input)
        for n, s in zip(self.names, specs):
            self.register_buffer(n, torch.zeros(s.shape, dtype=s.dtype))

    def forward(self, position_ids, new):
        cache = self.cls(self.dims, [getattr(self, n) for n in self.names], position_ids)
        for layer, (k, v) in zip(self.dims.kv_layers, new):
            cache.update(k, v, layer)
        for n, t in zip(self.names, cache.kv):
            if self.in_place:
                getattr(self, n).copy_(t)
            else:
                setattr(self, n, t)


def dims_e2b() -> ModelDims:
    import json

    import transformers as tf

    d = json.loads(CONFIG.read_text())
    d.pop("model_type")
    return ModelDims.from_hf(tf.Gemma4TextConfig(**d))


def step_inputs(dims, specs, batch, ctx, step, dtype, device):
    pos = (torch.arange(batch, dtype=torch.int32) * 131 + 17 * step) % ctx  # every row somewhere else
    gen = torch.Generator().manual_seed(step)
    new = [tuple(torch.randn(s.shape[0], s.shape[1], 1, s.shape[3], generator=gen).to(dtype).to(device)
                 for _ in range(2)) for s in specs[::2]]
    return pos[:, None].to(device), new


def time_backend(backend, dims, specs, args, dtype, in_place=False) -> dict[str, tuple[float, list]]:
    sync, device = (lambda: None), torch.device("cpu")
    if backend == "xla":
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        import torch_xla
        import torch_xla.core.xla_model as xm

        def sync():  # execution is asynchronous: wait for it, or only the dispatch is timed
            torch_xla.sync()
            xm.wait_device_ops()

        device = torch_xla.device()
    out = {}
    for name, cls in (("where", WhereKV), ("scatter", DecodeKV)):
        state = KvState(dims, specs, cls, in_place).to(device)
        times = []
        with torch.no_grad():
            for step in range(args.steps + 1):  # step 0: warm-up (and the one XLA compile)
                pos, new = step_inputs(dims, specs, args.batch, args.context, step, dtype, device)
                t = time.perf_counter()
                state(pos, new)
                sync()
                if step:
                    times.append(time.perf_counter() - t)
        out[name] = (sorted(times)[len(times) // 2], [getattr(state, n).cpu() for n in state.names])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--backends", default="cpu,xla")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    dims = dims_e2b()
    specs = kv_specs(dims, args.batch, args.context, dtype)
    mb = sum(torch.Size(s.shape).numel() for s in specs) * dtype.itemsize / 2**20
    print(f"E2B KV: {len(specs)} buffers ({len(dims.kv_layers)} layers x K, V), batch {args.batch}, context "
          f"{args.context}, {args.dtype}: {mb:.0f} MiB; median of {args.steps} steps")
    runs = [(b, False) for b in args.backends.split(",")] + [("xla", True)] * ("xla" in args.backends)
    for backend, in_place in runs:
        r = time_backend(backend, dims, specs, args, dtype, in_place)
        same = all(torch.equal(a, b) for a, b in zip(r["where"][1], r["scatter"][1]))
        w, s = r["where"][0] * 1e3, r["scatter"][0] * 1e3
        label = "xla, state aliased" if in_place else backend
        print(f"{label:>18}: where {w:8.1f} ms/step   scatter {s:8.1f} ms/step   ratio where/scatter {w / s:5.2f}x"
              f"   buffers identical: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
