"""Building Neuron artifacts with NxD ModelBuilder V2: trace each prefill bucket, both decode graphs and the extend
graphs asked for (`neuron.ExtendShape`: chunked prefill's `extend_1xT` and `extend_1xT_logits`, the mixed graphs
`mixed_BxT` and `mixed_BxT_logits`, the verify shape `extend_Bx{K+1}_all`; the top-K ones `_h` with a drafter)
from one `NeuronGraphModel` (so all graphs share the device KV state), check what each trace took as weights and
as state against what we save, compile with per-graph flags and a bound on parallel compiler jobs
(`neuron_compile`: the riskiest graph first, every NEFF kept so a retry resumes), and save the NxDModel plus each
rank's weights. The top-K of `decode` and of the extend graphs is the graphs' tiled one (`model.tiled_topk`) with
the SDK's TopK per tile (`neuron_topk`).

With an MTP drafter (`drafter`, a loaded `model.assistant.Assistant`) the module holds its weights too (`drafter.*`,
saved beside the target's; at tp=2 its layers sharded as the cpu backend's, `parallel.layers.apply_tp_assistant`:
query heads split as the rank-local K/V they read, its embedding, head and projections whole), the candidate graphs
are traced in their `_h` variants and the `draft` graph last, with its hidden state as the keyword input `hidden`
(`graph_model.draft_call`); like every graph it must take exactly the KV buffers as state (it returns them
unchanged).

WRITTEN AGAINST THE NxD CORE 0.19 SOURCE AND DOCS, NOT RUN ON HARDWARE HERE: tests/doubles/neuron_double.py
stands in for the SDK and enforces the rules the real one does. Compiling needs a Neuron host:
NxDParallelState probes the platform; `--target inf2` is a neuronx-cc flag, not a cross-compile switch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from neuron_workers.backends.neuron import (
    MODEL_FILE,
    PHASE_FLAGS,
    WEIGHTS_DIR,
    NeuronSpecs,
    graph_flags,
    require_neuron,
)
from neuron_workers.backends.neuron_compile import CACHE_DIR, WORK_DIR, compile_graphs, risk_order
from neuron_workers.errors import UserError
from neuron_workers.model import window_graphs
from neuron_workers.model.graph_model import (
    NeuronGraphModel,
    draft_call,
    graph_model,
    make_buffers_persistent,
    media_call,
)
from neuron_workers.model.spec import DECODE, DRAFT, MIXED
from neuron_workers.parallel.collectives import NxdCollectives

INPUT_STATE = "INPUT_STATE"  # metaneff_pb2.MetaTensor.Type name of aliased state inputs
EMBEDDING_KEYS = ("embed_tokens.weight", "lm_head.weight", "lm_head.embedding.weight")  # one tensor, tied


def build_neuron(loaded, tp: int, batch: int, max_context: int, buckets, out_dir: Path, progress,
                 jobs: int = 1, resume_hint: str = "", extend=(), drafter=None, windows: int = 0) -> dict[str, str]:
    """Trace the prefill `buckets`, both decodes, the `extend` shapes (`neuron.ExtendShape`s), with a `drafter`
    the draft graph and with `windows` kept sliding windows their pool (module state) and the three window graphs
    (`model/window_graphs.py`), compile (`neuron_compile.compile_graphs`: riskiest graph first, NEFFs kept for a
    retry) and save; returns the compiler flags per graph tag."""
    _, nxd = require_neuron()
    from safetensors.torch import save_file

    from neuron_workers.parallel.layers import apply_tp
    from neuron_workers.parallel.shard_plan import plan_for

    dims, dtype = loaded.dims, loaded.dtype
    persistent = make_buffers_persistent(loaded.hf_lm)
    full = dict(loaded.hf_lm.state_dict())  # unsharded weights (+ RoPE tables, embed scale), serving dtype
    plan = plan_for(loaded.info.text_config, tp)
    kv_heads = plan.kv_heads if tp > 1 else None
    # the very specs NeuronBackend asks for at run time (one code path: NeuronSpecs.graph_specs)
    spec_maker = NeuronSpecs(dims, max_context, buckets, batch, dtype, kv_heads)
    spec_maker.hidden_states = drafter is not None
    specs = spec_maker.graph_specs(extend)
    with nxd.NxDParallelState(world_size=tp, rank=0, tensor_model_parallel_size=tp, lnc_size=1):
        if tp > 1:
            apply_tp(loaded.hf_lm, plan, 0, NxdCollectives())  # rank-0 shapes; SPMD: one program for all ranks
        model = graph_model(loaded.hf_lm, dims, max_context, batch, dtype, kv_heads)
        drafter_plan = attach_drafter(model, drafter, tp, full, persistent) if drafter is not None else None
        if drafter is not None:
            model.draft_state = draft_state()
            progress(f"draft graph state: {model.draft_state} (GEMMA4_DRAFT_STATE; `compile smoke` step `state`)")
        model.use_topk(neuron_topk)
        pools = window_graphs.make_pool(model, windows) if windows else []  # state beside the KV, all graphs
        builder = nxd.ModelBuilder(model)
        for i, spec in enumerate(specs, 1):
            progress(f"[{i}/{len(specs)}] tracing {spec.tag}")
            trace_one(builder, model, spec, bool(dims.ple_dim))
        for phase in window_graphs.INPUTS if windows else ():
            progress(f"tracing {phase} ({windows} kept windows)")
            builder.trace(args=(), kwargs=window_graphs.inputs(phase, *[0] * len(window_graphs.INPUTS[phase])),
                          tag=phase)
        weights = [rank_state_dict(model, full, plan, r, drafter_plan) for r in range(tp)]
        traced = check_traces(builder.trace_artifacts_collection, set(weights[0]), set(model.kv_names), set(pools))
        copies = sorted(k for k in traced if k.endswith(EMBEDDING_KEYS) and not k.startswith("drafter."))
        if len(copies) > 1:  # compile plan counts one; graph_model.TiedHead is there to keep it one
            progress(f"warning: the traces take the tied embedding {len(copies)} times ({copies}): "
                     f"{len(copies) - 1} extra vocab x hidden copies of HBM per core that compile plan does not count")
        flags = {spec.tag: graph_flags(spec) for spec in specs}
        flags.update({phase: PHASE_FLAGS[DECODE] for phase in window_graphs.INPUTS if windows})  # copies: latency
        progress(f"compiling {len(specs)} graphs with neuronx-cc: {risk_order(flags)[0]} first and alone, then "
                 f"{jobs} at a time (minutes to tens of minutes each; logs in {out_dir / WORK_DIR}, compiled graphs "
                 f"kept in {out_dir / CACHE_DIR}); {len(persistent)} non-persistent buffers saved")
        nxd_model = compile_graphs(builder, flags, out_dir, jobs, progress, resume_hint, weight_layout())
    nxd_model.save(str(out_dir / MODEL_FILE))
    (out_dir / WEIGHTS_DIR).mkdir(exist_ok=True)
    for r, w in enumerate(weights):
        kept = {k: v.contiguous().clone() for k, v in w.items() if k in traced}  # tied duplicates drop out
        save_file(kept, str(out_dir / WEIGHTS_DIR / f"tp{r}.safetensors"))
    return flags


def attach_drafter(model: NeuronGraphModel, drafter, tp: int, full: dict, persistent: list):
    """Make `drafter` the module's (`NeuronGraphModel.attach`), sharded to rank 0's shapes at tp > 1; its full
    weights join `full` under `drafter.` (token_ordering int32, as the module holds it) and its non-persistent
    buffers `persistent`. Returns the drafter's shard plan."""
    from neuron_workers.parallel.layers import apply_tp_assistant
    from neuron_workers.parallel.shard_plan import plan_for_assistant

    dplan = plan_for_assistant(drafter.info.text_config, tp)
    persistent += make_buffers_persistent(drafter)
    whole = {f"drafter.{k}": v.to(torch.int32) if k.endswith("token_ordering") else v
             for k, v in drafter.state_dict().items()}  # before the layers are sliced
    if tp > 1:
        apply_tp_assistant(drafter, dplan, 0, NxdCollectives())
    model.attach(drafter)
    full.update(whole)
    return dplan


def trace_one(builder, model: NeuronGraphModel, spec, ple: bool) -> None:
    """Trace one graph with zero inputs of its spec. decode / decode_logits / decode_h (and each extend shape's
    variants) share inputs: the variant is the module's switches, set here; the draft graph takes its hidden
    state as a keyword."""
    zeros = tuple(t.zeros() for t in spec.host_inputs)
    if spec.phase == DRAFT:
        args, kwargs = draft_call(zeros, ple)
        builder.trace(args=args, kwargs=kwargs, tag=spec.tag)
        return
    model.candidates, model.per_position, model.hidden = spec.candidates, spec.per_position, spec.hidden
    model.mixed = spec.phase == MIXED  # the mixed graph takes an extend graph's inputs
    args, kwargs = media_call(spec, zeros)
    builder.trace(args=args, kwargs=kwargs, tag=spec.tag)


def weight_layout() -> bool:
    """Whether the build optimizes the weights' device layout for `decode` (`neuron_compile.priority_layout`):
    GEMMA4_WEIGHT_LAYOUT=1; off unless set, until `compile smoke` times it on hardware."""
    import os

    value = os.environ.get("GEMMA4_WEIGHT_LAYOUT", "0")
    if value not in ("0", "1"):
        raise UserError(f"GEMMA4_WEIGHT_LAYOUT={value!r}: 1 (optimize the weights' layout for decode) or 0")
    return value == "1"


def draft_state() -> str:
    """How the draft graph keeps the KV as state (`graph_model.DRAFT_STATES`): GEMMA4_DRAFT_STATE, "clone" unless
    set ("rmw" when `compile smoke`'s `state` step finds that an unchanged clone copies the buffers)."""
    import os

    from neuron_workers.model.graph_model import DRAFT_STATES

    value = os.environ.get("GEMMA4_DRAFT_STATE", "clone")
    if value not in DRAFT_STATES:
        raise UserError(f"GEMMA4_DRAFT_STATE={value!r}: one of {', '.join(DRAFT_STATES)}")
    return value


def neuron_topk(x: torch.Tensor, k: int, dim: int):
    """The per-tile op of the graphs' tiled top-K (`model.tiled_topk`): the SDK's TopK, as NxD's
    `operators.topk` calls it on trn1/inf2 (no NKI top-k kernel there; torch.topk would lower to a sort).
    The graph code gives it rows of at most `tiled_topk.TILE_LIMIT` and k <= 256, never a negative dim."""
    from torch_neuronx.xla_impl.ops import TopK

    if dim < 0:
        raise ValueError(f"TopK takes a non-negative dim (got {dim}), as every NxD caller passes")
    return TopK.apply(x, k, dim=dim)


def rank_state_dict(model: NeuronGraphModel, full: dict[str, torch.Tensor], plan, rank: int, drafter_plan=None
                    ) -> dict:
    """Rank `rank`'s weights for `model` (built for any rank), sliced from the full HF state dict (and the
    drafter's, `drafter.`: its layers by `drafter_plan`, the rest whole)."""
    from neuron_workers.parallel.layers import shard_tensor

    out = {}
    for key in model.state_dict():
        if key in model.kv_names or key in getattr(model, "pool_names", ()):
            continue  # KV state (and the kept windows' pool) starts at zero on the device
        if key.startswith("drafter."):  # the MTP drafter's: layers sliced as `apply_tp_assistant` did, rest whole
            sub = key.removeprefix("drafter.")
            out[key] = shard_tensor(drafter_plan, sub, full[key], rank) if sub.startswith("model.layers.") \
                else full[key]
            continue
        hf_key = key.removeprefix("lm.").replace("lm_head.embedding.", "model.embed_tokens.")
        hf_key = "model.embed_tokens.weight" if hf_key == "lm_head.weight" else hf_key  # tied
        if hf_key.endswith("vocab_start"):
            out[key] = torch.tensor([rank * plan.vocab_per_rank], dtype=torch.int32)
        else:
            out[key] = shard_tensor(plan, hf_key, full[hf_key], rank)
    return out


def check_traces(artifacts: dict, saved: set[str], kv_names: set[str], pools: set[str] = frozenset()) -> set[str]:
    """Every weight a trace takes must be one we save, and every trace's state must be exactly the KV
    buffers (a buffer a graph only writes is not linked as state), the window graphs' the KV buffers and the
    window pool (`pools`). Returns the union of traced weights, as dotted state-dict keys."""
    traced: set[str] = set()
    for tag, art in artifacts.items():
        names = traced_weight_names(art)
        missing = sorted(names - saved)
        if missing:
            raise UserError(f"graph {tag} takes weights we would not save: {missing[:5]}"
                            f"{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)")
        state = state_names(art.metaneff)
        want = kv_names | pools if tag in window_graphs.INPUTS else kv_names
        if state != want:
            raise UserError(f"graph {tag}: its device state is not exactly the KV buffers (missing "
                            f"{sorted(want - state)[:4]}, extra {sorted(state - want)[:4]})")
        traced |= names
    return traced


def traced_weight_names(art) -> set[str]:
    """A trace's weights as dotted state-dict keys: `weight_name_to_idx` joins module names with `->`
    (`'query->weight'` in NxD's ModelBuilder V2 test; hlo_utils makes checkpoint keys with
    `.replace("->", ".")`), while set_weights takes dotted state-dict names."""
    return {name.replace("->", ".") for name in art.weight_name_to_idx}


def state_names(metaneff) -> set[str]:
    """The checkpoint keys of a trace's aliased state inputs (NxDModel.add reads them the same way)."""
    out = set()
    for t in metaneff.input_tensors:
        if _type_name(t) == INPUT_STATE:
            key = t.checkpoint_key
            out.add(key.decode() if isinstance(key, bytes) else str(key))
    return out


def _type_name(tensor) -> str:
    kind = tensor.type
    if isinstance(kind, str):
        return kind
    from torch_neuronx.proto import metaneff_pb2

    return metaneff_pb2.MetaTensor.Type.Name(kind)
