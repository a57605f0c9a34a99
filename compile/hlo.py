"""`python -m compile hlo`: each graph's HLO text from the xla twin (the module `compile build --backend neuron`
traces, lowered by torch-xla 2.9, the lowering torch-neuronx 2.9 uses), plus an audit of it, so the first
inf2 run can diff them against neuronx-cc's `graph.hlo`.

    python -m compile hlo --model DIR --out DIR [--batch B --max-context N --prefill-buckets 16,32 --dtype D]
                          [--draft-model DIR]

writes `<tag>.hlo.txt` per graph (prefill buckets, both decode graphs, the extend graphs; with a drafter the
candidate graphs' `_h` variants and the `draft` graph) and `audit.json`; prints one line per graph.
The audit (`audit`) reads the ENTRY computation: the op inventory, 64-bit types, the largest literal
constants, how each KV buffer is written (a scatter of one position per row in decode, never a select
over the whole buffer; the draft graph writes none: every KV buffer leaves as the parameter it came in as),
how it is read (`kv_slot_gathers`: the slots a gather copies out of a whole buffer; none in decode and the verify
graph, which attend over the buffers in place),
and the width of every row a `sort` / `topk` orders (the tiled top-K's tiles), and the gathers a Neuron device
would lower densely (`element_gathers`): torch-xla 2.9 lowers a torch.gather whose gathered dim holds
<= 10 x XLA_DENSE_GATHER_FACTOR (default 8,192: 81,920) elements as a one-hot compare / select / reduce on a NEURON
device (`IsSparseGather`); on the XLA CPU device every one is an HLO `gather` of single elements (`offset_dims={}`),
which the audit lists with its gathered dim's size, and `dense_on_neuron` counts those under the factor the build
runs with (`neuron.force_sparse_gathers` sets 0: none).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

# `%name = type[dims]{layout} op(`; tuple-typed results (`(f32[..], ...)`) are not matched, and need not be
INSTR = re.compile(r"^\s*(?:ROOT )?%\S+ = ([a-z]+\d*)\[([\d,]*)\](?:\{[^}]*\})? ([a-z][\w-]*)\((.*)$")
OPERAND = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
NAMED = re.compile(r"^\s*(?:ROOT )?(%\S+) = ")
ROOT_OPERANDS = re.compile(r"%[\w.-]+")
WIDE = ("f64", "s64", "u64", "c128")
GATHER = re.compile(r" gather\(([a-z]+\d*)\[([\d,]*)\](?:\{[^}]*\})? %[^,]+, ([a-z]+\d*)\[([\d,]*)\].*?"
                    r"offset_dims=\{([\d,]*)\}")
DEFAULT_DENSE_FACTOR = 8192  # torch-xla 2.9's XLA_DENSE_GATHER_FACTOR default
VERIFY_T = 8  # T of the per-position (speculative verify) extend graph the audit covers


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d)


def entry_lines(hlo: str) -> list[str]:
    """The instructions of the ENTRY computation (the graph itself, not reducers / combiners)."""
    lines, inside = [], False
    for line in hlo.splitlines():
        if line.startswith("ENTRY "):
            inside = True
        elif inside and line.startswith("}"):
            break
        elif inside:
            lines.append(line)
    return lines


def audit(hlo: str, kv_shapes: list[tuple[int, ...]]) -> dict:
    """Facts about one graph's HLO. `kv_shapes`: the KV buffers' shapes (one per buffer, repeats allowed)."""
    ops: dict[str, int] = {}
    wide: dict[str, int] = {}  # 64-bit type -> largest element count seen
    constants: list[tuple[str, int]] = []
    kv = {tuple(s) for s in kv_shapes}
    flat = {(math.prod(s[:-1]), s[-1]) for s in kv}  # the [B*H*N, D] view the extend graph scatters into
    kv_selects, kv_scatters, kv_params = 0, [], 0
    for line in entry_lines(hlo):
        m = INSTR.match(line)
        if not m:
            continue
        ty, dims, op, rest = m.group(1), _dims(m.group(2)), m.group(3), m.group(4)
        ops[op] = ops.get(op, 0) + 1
        n = math.prod(dims)
        for t, d in [(ty, dims)] + [(t, _dims(d)) for t, d in OPERAND.findall(rest)]:
            if t in WIDE:
                wide[t] = max(wide.get(t, 0), math.prod(d))
        if op == "constant":
            constants.append((f"{ty}[{m.group(2)}]", n))
        if (dims in kv or (dims in flat and op != "parameter")) and ty not in ("pred",) and not ty.startswith("s"):
            if op == "select":
                kv_selects += 1
            elif op == "scatter":
                operands = OPERAND.findall(rest)
                update = _dims(operands[2][1]) if len(operands) >= 3 else ()
                kv_scatters.append(math.prod(update))
            elif op == "parameter":
                kv_params += 1
    constants.sort(key=lambda c: -c[1])
    sorts = sort_widths(hlo)
    gathered = element_gathers(hlo)
    slot_reads = kv_slot_gathers(hlo, kv)
    return {"ops": dict(sorted(ops.items(), key=lambda kv_: (-kv_[1], kv_[0]))), "wide": wide,
            "largest_constants": constants[:3], "constant_elements": sum(n for _, n in constants),
            "kv_parameters": kv_params, "kv_selects": kv_selects, "kv_scatter_update_elements": kv_scatters,
            "kv_passed_through": passed_through(hlo, kv), "sort_widths": sorts, "widest_sort": max(sorts, default=0),
            "element_gathers": gathered, "dense_on_neuron": dense_on_neuron(gathered), "kv_slot_gathers": slot_reads}


def kv_slot_gathers(hlo: str, kv: set[tuple[int, ...]]) -> list[int]:
    """For every `gather` that takes a whole KV buffer (a KV-shaped operand), the slots it copies out (its result's
    first dim): 1 in the chunk graphs (their one row's slot), none in decode and the graphs over every slot, which
    read the buffers in place (`model.in_place`)."""
    out = []
    for line in entry_lines(hlo):
        m, i = GATHER.search(line), INSTR.match(line)
        if m and i and _dims(m.group(2)) in kv:
            out.append(_dims(i.group(2))[0])
    return out


def element_gathers(hlo: str) -> list[int]:
    """The gathered dim's size of every element-wise `gather` of the ENTRY computation (torch.gather's lowering:
    no offset dims; an `index_select`'s slices have offset dims and are always sparse). The gathered dim is the one
    the operand has more of than the result (the largest operand dim when none is: a permutation)."""
    out = []
    for line in entry_lines(hlo):
        m = GATHER.search(line)
        if not m or m.group(5):
            continue
        operand, result = _dims(m.group(2)), _dims(INSTR.match(line).group(2)) if INSTR.match(line) else ()
        grown = [a for a, b in zip(operand, result) if a > b]
        out.append(max(grown) if grown else max(operand, default=0))
    return out


def dense_on_neuron(gathered: list[int], factor: int | None = None) -> int:
    """How many of `gathered` (`element_gathers`) a NEURON device lowers densely under XLA_DENSE_GATHER_FACTOR
    `factor` (None: this process's environment, torch-xla's default 8,192 when unset; 0: none)."""
    if factor is None:
        import os

        factor = int(os.environ.get("XLA_DENSE_GATHER_FACTOR", DEFAULT_DENSE_FACTOR))
    return sum(1 for n in gathered if n <= factor * 10)


def passed_through(hlo: str, kv: set[tuple[int, ...]]) -> int:
    """How many of the graph's results are KV-shaped parameters returned as they came in (the ROOT tuple's
    operands that are parameters): every KV buffer in the draft graph (it writes none), none in a graph
    that writes them."""
    params, root = set(), ""
    for line in entry_lines(hlo):
        m, name = INSTR.match(line), NAMED.match(line)
        if m and name and m.group(3) == "parameter" and _dims(m.group(2)) in kv:
            params.add(name.group(1))
        if line.lstrip().startswith("ROOT "):
            root = line.split(" tuple(", 1)[-1]
    return sum(1 for op in ROOT_OPERANDS.findall(root) if op in params)


SORT = re.compile(r" (sort|topk)\(([a-z]+\d*)\[([\d,]*)\][^)]*\)(.*)$")


def sort_widths(hlo: str) -> list[int]:
    """The length of the row each `sort` / `topk` instruction of the ENTRY computation orders (torch-xla
    lowers torch.topk to a sort of the whole row, then a slice), in order: the tiled top-K must keep every
    one within `model.tiled_topk.TILE_LIMIT`."""
    out = []
    for line in entry_lines(hlo):
        m = SORT.search(line)
        if not m:
            continue
        dims = _dims(m.group(3))
        d = re.search(r"dimensions=\{(\d+)\}", m.group(4))
        out.append(dims[int(d.group(1))] if d else dims[-1])
    return out


def graph_hlos(backend) -> dict[str, str]:
    """tag -> HLO text of every graph of an `XlaBackend` (prefill buckets, `decode_logits`, the top-K `decode`, and
    per extend bucket T: `extend_1xT`, `extend_1xT_logits`, `mixed_BxT`, `mixed_BxT_logits`, then `extend_Bx8_all`;
    with a drafter the candidate graphs' `_h` variants instead, then `draft`), traced with zero
    host inputs as `compile build` traces them; nothing runs."""
    from neuron_workers.model.spec import DECODE, DRAFT, PREFILL

    hidden = backend.hidden_states
    specs = [backend.spec(PREFILL, b) for b in backend.buckets] + [backend.spec(DECODE)]
    specs += [backend.spec(DECODE, 1, backend.candidates, hidden=hidden)] if backend.candidates else []
    for t in getattr(backend, "extend_buckets", ()):  # chunked prefill's graphs
        specs += [backend.extend_spec(t, 1), backend.extend_spec(t, 1, logits=True)]
        specs += [backend.mixed_spec(t), backend.mixed_spec(t, logits=True)]
    if backend.candidates:  # the verify shape of speculative decoding: every row, T = 8, per-position candidates
        t = min(VERIFY_T, backend.dims.ring_size(backend.max_context))
        specs.append(backend.extend_spec(t, backend.max_batch, per_position=True))
    specs += [backend.spec(DRAFT)] if hidden else []
    return {s.tag: backend.hlo(s, tuple(t.zeros() for t in s.host_inputs)) for s in specs}


def kv_shapes(backend) -> list[tuple[int, ...]]:
    from neuron_workers.model.spec import DECODE

    return [t.shape for t in backend.spec(DECODE).kv_inputs]


def write_hlo(cfg, out_dir: str | Path, progress=print) -> dict[str, dict]:
    """Write every graph's HLO and `audit.json` for `cfg` (an EngineConfig of the xla backend)."""
    from neuron_workers.factory import build_engine

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine = build_engine(cfg)
    try:
        backend = engine.backend
        shapes, report = kv_shapes(backend), {}
        for tag, text in graph_hlos(backend).items():
            (out / f"{tag}.hlo.txt").write_text(text)
            a = report[tag] = audit(text, shapes)
            biggest = a["largest_constants"][0] if a["largest_constants"] else ("none", 0)
            progress(f"{tag}: {sum(a['ops'].values())} instructions, {a['ops'].get('parameter', 0)} parameters, "
                     f"64-bit {a['wide'] or 'none'}, largest constant {biggest[0]}, KV: "
                     f"{len(a['kv_scatter_update_elements'])} scatters, {a['kv_selects']} whole-buffer selects, "
                     f"{a['kv_passed_through']} returned unchanged, {len(a['kv_slot_gathers'])} slot gathers "
                     f"({sum(a['kv_slot_gathers'])} slots), "
                     f"sorts over rows of {a['sort_widths'] or 'none'}, {len(a['element_gathers'])} element gathers "
                     f"(widest {max(a['element_gathers'], default=0)}), {a['dense_on_neuron']} dense on a Neuron "
                     f"device")
    finally:
        engine.close()
    (out / "audit.json").write_text(json.dumps(report, indent=1))
    progress(f"wrote {len(report)} graphs and audit.json to {out}")
    return report
