"""What a traced graph does with its state and weights, read off a torch.export of the module that the
Neuron build traces: for each state buffer (KV, and the kept windows' pool), whether the graph reads it, replaces
it, and computes the new value from the old one (the rule for device state); and the names of the other tensors it
reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# the exported ops torch-xla lowers with `IsSparseGather` (data_ops.cpp), by the name a refusal gives
ELEMENT_GATHERS = {torch.ops.aten.gather.default: "aten.gather", torch.ops.aten.take.default: "aten.take",
                   torch.ops.aten.take_along_dim.default: "aten.take_along_dim"}


@dataclass
class KvUse:
    read: bool  # the graph reads the old buffer
    written: bool  # the graph replaces it
    from_old: bool  # the new value is a function of the old one


class _Outputs(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *args, **kwargs):
        head = self.m(*args, **kwargs)  # the logits, or (candidate values, ids), or (draft ids, next hidden)
        return (*(head if isinstance(head, tuple) else (head,)), *(getattr(self.m, n) for n in state_of(self.m)))


def state_of(module) -> list[str]:
    """The module's device-state buffers: its KV buffers and, with kept windows, their pool (`pool_names`)."""
    return list(module.kv_names) + list(getattr(module, "pool_names", ()))


def trace_facts(module, args, kwargs=None) -> tuple[dict[str, KvUse], list[str]]:
    """Export module(*args, **kwargs) and read off (per KV buffer: read / written / from its old value) and the
    names of the other tensors the forward reads (its weights, as a trace sees them)."""
    uses, weights, _, _ = export_facts(module, args, kwargs)
    return uses, weights


def export_facts(module, args, kwargs=None) -> tuple[dict[str, KvUse], list[str], list[tuple[int, ...]], list]:
    """`trace_facts`, plus the shapes of the graph's outputs before the KV buffers (its heads) and, per element
    gather (`gathered_dims`: what torch-xla lowers by `IsSparseGather`), its op and the size of its gathered dim."""
    names = state_of(module)
    saved = {n: getattr(module, n) for n in names}
    try:
        with torch.no_grad():
            ep = torch.export.export(_Outputs(module), args, kwargs or None, strict=False)
    finally:
        for n, t in saved.items():
            setattr(module, n, t)
    sig = ep.graph_signature
    nodes = {n.name: n for n in ep.graph.nodes}
    outputs = list(next(n for n in ep.graph.nodes if n.op == "output").args[0])
    by_buffer = {b.removeprefix("m."): nodes[inp] for inp, b in sig.inputs_to_buffers.items()}
    uses = {}
    for i, name in enumerate(names):
        ph, out = by_buffer.get(name), outputs[len(outputs) - len(names) + i]
        uses[name] = KvUse(read=ph is not None and any(u.op != "output" for u in ph.users),
                           written=out is not ph, from_old=ph is not None and ph in _ancestors(out))
    weights = [p.removeprefix("m.") for p in sig.inputs_to_parameters.values()]
    weights += [b for b in by_buffer if b not in names]
    heads = [tuple(o.meta["val"].shape) for o in outputs[: len(outputs) - len(names)]]
    return uses, weights, heads, gathered_dims(ep.graph)


def gathered_dims(graph) -> list[tuple[str, int]]:
    """(op, gathered dim's size) of every element gather in an exported graph, the ops torch-xla 2.9 lowers through
    `IsSparseGather` (the size it compares is the input's along the gathered dim): `aten.gather` and
    `aten.take_along_dim` (which torch-xla runs as a gather) along `dim`, `aten.take` and a `take_along_dim` without
    a dim over the flattened input. `index.Tensor` / `index_select` lower to slice gathers and are never dense."""
    out = []
    for n in graph.nodes:
        if n.op != "call_function" or n.target not in ELEMENT_GATHERS:
            continue
        shape = n.args[0].meta["val"].shape
        dim = _gather_dim(n)
        width = shape.numel() if dim is None or not len(shape) else shape[dim]
        out.append((ELEMENT_GATHERS[n.target], int(width)))
    return out


def _gather_dim(node):
    """The dim an element gather node gathers along (None: the flattened input)."""
    if node.target is torch.ops.aten.take.default:
        return None
    if node.target is torch.ops.aten.gather.default:
        return node.args[1]
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")


def _ancestors(node) -> set:
    seen, todo = set(), [node]
    while todo:
        for parent in todo.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen
