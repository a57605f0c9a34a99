"""Building Neuron artifacts with NxD ModelBuilder V2: trace each prefill bucket and the decode step
from one `NeuronGraphModel` (so all graphs share the device KV state), compile them with per-phase
flags, and save the NxDModel plus each rank's weights. WRITTEN AGAINST THE DOCUMENTED APIs, NOT RUN
ON HARDWARE HERE; tests/neuron_double.py records and checks the calls."""

from __future__ import annotations

from pathlib import Path

from neuron_workers.backends.neuron import (ID_DTYPE, MODEL_FILE, PHASE_FLAGS, WEIGHTS_DIR, NxdCollectives,
                                            graph_inputs, graph_model, rank_state_dict, require_neuron)
from neuron_workers.spec import DECODE, PREFILL, make_spec


def build_neuron(loaded, tp: int, max_context: int, buckets, out_dir: Path, progress) -> dict[str, str]:
    """Compile and save; returns the compiler flags per graph tag."""
    _, nxd = require_neuron()
    from safetensors.torch import save_file

    from neuron_workers.shard_plan import plan_for
    from neuron_workers.tp_modules import apply_tp

    dims, dtype = loaded.dims, loaded.dtype
    full = dict(loaded.hf_lm.state_dict())  # unsharded weights, already in the serving dtype
    plan = plan_for(loaded.info.text_config, tp)
    kv_heads = plan.kv_heads if tp > 1 else None
    specs = [make_spec(dims, PREFILL, 1, b, max_context, dtype, ID_DTYPE, kv_heads) for b in buckets]
    specs.append(make_spec(dims, DECODE, 1, 1, max_context, dtype, ID_DTYPE, kv_heads))
    with nxd.NxDParallelState(world_size=tp, tensor_model_parallel_size=tp):
        if tp > 1:
            apply_tp(loaded.hf_lm, plan, 0, NxdCollectives())  # rank-0 shapes; SPMD: one program for all ranks
        model = graph_model(loaded.hf_lm, dims, max_context, dtype, kv_heads)
        builder = nxd.ModelBuilder(model)
        for i, spec in enumerate(specs, 1):
            progress(f"[{i}/{len(specs)}] tracing {spec.tag}")
            builder.trace(args=tuple(t.zeros() for t in graph_inputs(spec)), tag=spec.tag)
        flags = {spec.tag: PHASE_FLAGS[spec.phase] for spec in specs}
        progress(f"compiling {len(specs)} graphs with neuronx-cc (minutes to tens of minutes; "
                 f"logs in {out_dir / 'compiler_workdir'})")
        nxd_model = builder.compile(compiler_args=flags, compiler_workdir=str(out_dir / "compiler_workdir"))
        weights = [rank_state_dict(model, full, plan, r) for r in range(tp)]
    nxd_model.save(str(out_dir / MODEL_FILE))
    (out_dir / WEIGHTS_DIR).mkdir(exist_ok=True)
    for r, w in enumerate(weights):
        save_file({k: v.contiguous().clone() for k, v in w.items()}, str(out_dir / WEIGHTS_DIR / f"tp{r}.safetensors"))
    return flags
