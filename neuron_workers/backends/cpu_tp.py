"""Tensor-parallel CPU backend: one spawned process per rank, joined by torch.distributed (gloo).

Each rank loads the checkpoint, shards it with `parallel.layers.apply_tp` and keeps its own KV buffers
(as each NeuronCore would). The driver (the engine's process) sends every rank the same host-built
inputs and reads the logits (or the top-K candidates) back from rank 0 (every rank holds the same
all-gathered logits, so every rank computes the same candidates). An MTP drafter (`attach_drafter`) is loaded
and sharded by every rank itself; its draft steps run on the ranks' own KV.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import tempfile
import traceback

import torch
import torch.multiprocessing as mp

from neuron_workers.backends.base import GraphBackend
from neuron_workers.model.spec import GraphSpec

REPLY_TIMEOUT_S = float(os.environ.get("GEMMA4_TP_TIMEOUT_S", "600"))


def _rank_main(rank, tp, init_file, model_dir, max_context, buckets, dtype, mode, max_batch, cmds, replies,
               media_ids=()):
    try:
        import torch.distributed as dist

        from neuron_workers.backends.cpu import CpuBackend
        from neuron_workers.model.loader import load_model
        from neuron_workers.parallel.collectives import TorchDistCollectives
        from neuron_workers.parallel.layers import apply_tp
        from neuron_workers.parallel.shard_plan import plan_for

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=tp)
        model = load_model(model_dir, dtype)
        model.dims = dataclasses.replace(model.dims, media_ids=tuple(media_ids))  # the graphs take mm_embeds
        plan = plan_for(model.info.text_config, tp)
        apply_tp(model.hf_lm, plan, rank, TorchDistCollectives(tp))
        backend = CpuBackend(model.hf_lm, model.dims, max_context, buckets, dtype, mode, kv_heads=plan.kv_heads,
                             max_batch=max_batch)
        replies.put(("ready", rank, None))
        while True:
            cmd = cmds.get()
            if cmd[0] == "close":
                break
            if cmd[0] == "attach":  # the MTP drafter: this rank loads and shards it
                backend.attach_drafter(_sharded_assistant(cmd[1], dtype, tp, rank, TorchDistCollectives(tp)))
                replies.put(("ready", rank, None))
                continue
            if cmd[0] == "window":  # kept sliding windows: make_window_pool / save_window / restore_window
                getattr(backend, cmd[1])(*cmd[2])
                continue
            key, inputs = cmd
            out = backend.draft(inputs) if key == "draft" else backend._run(backend.spec(*key), inputs)
            if rank == 0:
                replies.put(("logits", rank, out.clone() if isinstance(out, torch.Tensor)
                             else tuple(t.clone() for t in out)))
        dist.destroy_process_group()
    except Exception:  # reported to the driver, which raises it
        replies.put(("error", rank, traceback.format_exc()))


def _sharded_assistant(model_dir: str, dtype, tp: int, rank: int, coll):
    from neuron_workers.model.assistant import load_assistant
    from neuron_workers.parallel.layers import apply_tp_assistant
    from neuron_workers.parallel.shard_plan import plan_for_assistant

    assistant = load_assistant(model_dir, dtype)
    return apply_tp_assistant(assistant, plan_for_assistant(assistant.info.text_config, tp), rank, coll)


class TpCpuBackend(GraphBackend):
    """The driver side: host inputs are the same on every rank (KV is per rank and stays there)."""

    def __init__(self, model_dir, dims, tp: int, max_context: int, buckets, dtype=torch.float32,
                 mode: str = "eager", max_batch: int = 1):
        from neuron_workers.model.loader import load_model
        from neuron_workers.parallel.shard_plan import plan_for

        plan = plan_for(load_model(model_dir, dtype, with_weights=False).info.text_config, tp)
        super().__init__(dims, max_context, buckets, max_batch, dtype, plan.kv_heads)
        self.tp, self.plan = tp, plan
        self.prompt_scores = True  # the ranks build the per-position logits extend graph on first use
        ctx = mp.get_context("spawn")
        self._init_file = tempfile.NamedTemporaryFile(prefix="gemma4-tp-", delete=False).name
        os.unlink(self._init_file)
        self.replies = ctx.Queue()
        self.cmds = [ctx.Queue() for _ in range(tp)]
        self.procs = [ctx.Process(target=_rank_main, daemon=True, args=(
            r, tp, self._init_file, str(model_dir), max_context, self.buckets, dtype, mode, max_batch, self.cmds[r],
            self.replies, dims.media_ids)) for r in range(tp)]
        for p in self.procs:
            p.start()
        self._collect("ready", tp)

    def _collect(self, kind: str, n: int) -> dict[int, object]:
        got = {}
        while len(got) < n:
            try:
                tag, rank, payload = self.replies.get(timeout=REPLY_TIMEOUT_S)
            except queue.Empty:
                self.close()
                raise RuntimeError(f"tensor-parallel ranks did not answer within {REPLY_TIMEOUT_S:.0f}s") from None
            if tag == "error":
                self.close()
                raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{payload}")
            got[rank] = payload
        return got

    def _run(self, spec: GraphSpec, inputs):
        return self._ask((spec.phase, spec.seq_len, spec.candidates, spec.rows, spec.per_position, spec.hidden), inputs)

    def _ask(self, key, inputs):
        for q in self.cmds:
            q.put((key, tuple(t.clone() for t in inputs)))
        return self._collect("logits", 1)[0]

    def attach_drafter(self, assistant) -> None:
        """Every rank loads the drafter from its directory and shards its layers (`apply_tp_assistant`)."""
        from neuron_workers.parallel.shard_plan import plan_for_assistant

        plan_for_assistant(assistant.info.text_config, self.tp)  # a UserError here, before the ranks try
        for q in self.cmds:
            q.put(("attach", str(assistant.info.model_dir)))
        self._collect("ready", self.tp)
        self.hidden_states = True

    def draft(self, inputs):
        return self._ask("draft", inputs)

    def make_window_pool(self, entries: int) -> None:
        self._windows("make_window_pool", entries)

    def save_window(self, slot: int, entry: int, start: int) -> None:
        self._windows("save_window", slot, entry, start)

    def restore_window(self, slot: int, entry: int, start: int) -> None:
        self._windows("restore_window", slot, entry, start)

    def clone_slot(self, src: int, dst: int, n: int) -> None:
        self._windows("clone_slot", src, dst, n)

    def _windows(self, op: str, *args) -> None:
        """Every rank copies its own share (queued before the next step's inputs, so in order; a rank that
        fails reports it at the next step)."""
        for q in self.cmds:
            q.put(("window", op, args))

    def close(self) -> None:
        for q, p in zip(self.cmds, self.procs):
            if p.is_alive():
                q.put(("close",))
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        if os.path.exists(self._init_file):
            os.unlink(self._init_file)
