"""TEST DOUBLE, continued: the SDK ops and the NxD ModelBuilder V2 "fundamental units" the build calls
directly (`neuronx_distributed.trace.functions.compile`, `model_builder_utils.CompilationArtifacts`), with the
limits the real ones have or are reported to have. Nothing here is Neuron.

- `TopK` (torch_neuronx.xla_impl.ops.TopK): refuses k > 16,384 (aws-neuron-sdk#1339), a row wider than
  `TOPK_MAX_ROW` (NxD's runnable trn1 TopK tests use rows of 64 and 3,158, its 16,384-wide cases are xfail,
  and neuronx-cc 2.26 is reported failing at 32,768: we trust 8,192 and no wider) and a negative dim (every
  NxD caller passes a non-negative one), and any input but fp32 (NxD Inference casts logits to fp32 before its
  sampler's TopK and tests the op in fp32 only: a bf16 TopK is unproven). Ids come back as uint32, as the public
  op's (so a caller that indexes with them unconverted fails here too). Equal values come back in reverse id
  order, so the host's own tie rule is what the tests see. `TOPK_CALLS` records (dtype, shape, k) per call.
- `compile(hlo, metaneff, workdir, flags, key)`: writes a fake NEFF and a compiler log under
  `workdir/key/<n>/` as NxD does (`log-neuron-cc.txt`), records the call, and fails (RuntimeError, with
  the log written) for the tags in `FAIL_COMPILE`, so fail-fast and resume can be tested.
- `device_gather`: torch.gather as the device computes it, for the module the double runs on the CPU.
- how NxD names what it holds: `route_key` (NxDModel's router key), `device_copies` (a Parameter tie made before
  the move is one weight per module), `aliases_of` (a module reached by two paths is one tensor).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import torch

TOPK_MAX_K = 16384
TOPK_MAX_ROW = 8192
LOG_FILE = "log-neuron-cc.txt"  # ModelBuilderConstants.LOG_FILE_DEFAULT_NAME
TOPK_CALLS: list[tuple[torch.dtype, tuple[int, ...], int]] = []  # (dtype, shape, k) of every TopK call
COMPILED: list[tuple[str, str]] = []  # (tag, flags) compiled, in order (neuron_double.installed clears it)
FAIL_COMPILE: set[str] = set()  # tags whose compile fails


class DoubleRejects(AssertionError):
    """What the real SDK would reject, or silently get wrong."""


class TopK:
    """torch_neuronx.xla_impl.ops.TopK as NxD calls it (`TopK.apply(tensor, k, dim=dim)` -> values, indices)."""

    @staticmethod
    def apply(tensor, k, dim=None):
        if dim is None or dim < 0:
            raise DoubleRejects(f"TopK with dim={dim}: NxD always passes a non-negative dim")
        if k > TOPK_MAX_K:
            raise DoubleRejects(f"TopK with k={k}: the SDK refuses k > {TOPK_MAX_K} (aws-neuron-sdk#1339)")
        if tensor.shape[dim] > TOPK_MAX_ROW:
            raise DoubleRejects(f"TopK over a row of {tensor.shape[dim]}: wider than {TOPK_MAX_ROW}, which no "
                                f"public run shows neuronx-cc compiling (tile it)")
        if tensor.dtype != torch.float32:
            raise DoubleRejects(f"TopK on {tensor.dtype}: NxD Inference runs TopK on fp32 logits only (cast first)")
        TOPK_CALLS.append((tensor.dtype, tuple(tensor.shape), k))
        values, idx = torch.topk(tensor.flip(dim), k, dim=dim)
        return values, (tensor.shape[dim] - 1 - idx).to(torch.uint32)


class CompilationArtifacts:
    def __init__(self, neff_filepath: str):
        self.neff_filepath = neff_filepath

    def get_neff_bytes(self) -> bytes:
        return Path(self.neff_filepath).read_bytes()


def compile(hlo_module, metaneff, compiler_workdir=None, compiler_args=None, key=None):  # noqa: A001 (NxD's name)
    out = Path(compiler_workdir or "/tmp/nxd_model") / str(key)
    out = out / str(len(list(out.glob("*"))) if out.exists() else 0)
    os.makedirs(out, exist_ok=True)
    log = out / LOG_FILE
    COMPILED.append((key, compiler_args))
    if key in FAIL_COMPILE:
        log.write_text(f"test double: neuronx-cc {compiler_args}\nERROR 70 ISGV902: {key} failed (test double)\n")
        raise RuntimeError(f"Compilation failed for {key}")
    log.write_text(f"test double: neuronx-cc {compiler_args}\nCompiler status PASS\n")
    neff = out / "graph.neff"
    neff.write_bytes(b"test double NEFF for " + str(key).encode() + b" " + hlo_module.SerializeToString())
    return CompilationArtifacts(str(neff))


WLO: list[tuple[str, object]] = []  # ("mark" | "compile_wlo" | "layout" | "apply", key): the layout calls in order


class WLOArtifacts(CompilationArtifacts):
    def __init__(self, neff_filepath: str, wrapped_neff_hlo_filepath: str | None):
        super().__init__(neff_filepath)
        self.wrapped_neff_hlo_filepath = wrapped_neff_hlo_filepath


def mark_weights_for_wlo(trace_artifacts, weights_to_skip_layout_optimization=None):
    """hlo_utils.mark_weights_for_wlo: the priority graph's HLO gets its weights marked (here: a note in its text)."""
    WLO.append(("mark", trace_artifacts.tag))
    trace_artifacts.hlo.text += " [weights marked for WLO]"


def compile_wlo(hlo_module, metaneff, compiler_workdir=None, compiler_args=None, key=None):
    """functions.compile_wlo: the priority graph compiled, choosing the weights' layout; a NEFF and the wrapped
    NEFF HLO the others are rewritten against."""
    if "[weights marked for WLO]" not in hlo_module.text:
        raise DoubleRejects(f"compile_wlo({key}) of an HLO whose weights were not marked (mark_weights_for_wlo)")
    art = compile(hlo_module, metaneff, compiler_workdir, compiler_args, key)
    wrapped = Path(art.neff_filepath).with_name("wrapped_neff.hlo")
    wrapped.write_text(f"test double: layout of {key}")
    WLO.append(("compile_wlo", key))
    return WLOArtifacts(art.neff_filepath, str(wrapped))


def compile_layout_transformer(wlo_artifacts, priority_model_weight_name_to_idx, compiler_workdir=None,
                               logical_nc_config=1):
    WLO.append(("layout", len(priority_model_weight_name_to_idx)))
    return CompilationArtifacts(wlo_artifacts.neff_filepath)


def apply_layout_transformation(trace_artifacts, priority_model_trace_artifacts, wlo_artifacts, key=None):
    if not any(k == "compile_wlo" for k, _ in WLO):
        raise DoubleRejects("apply_layout_transformation before the priority graph was compiled with compile_wlo")
    WLO.append(("apply", key))
    trace_artifacts.hlo.text += f" [layout of {priority_model_trace_artifacts.tag}]"


def route_key(names, shapes) -> str:
    """NxDModel's route key: '(name: [shape], ...)' over the arguments given, in signature order."""
    return "(" + ", ".join(f"{n}: {list(s)}" for n, s in zip(names, shapes)) + ")"


def device_copies(module, weights: list[str]) -> list[str]:
    """The weights as the device holds them: a tensor set on two different modules (a Parameter tie made
    before the move) is one weight per module; a module reached by two paths is one weight."""
    owners: dict[int, dict[int, str]] = {}  # tensor -> owning module -> its first name
    for prefix, m in module.named_modules(remove_duplicate=False):
        for tname, t in list(m._parameters.items()) + list(m._buffers.items()):
            if t is not None:
                owners.setdefault(id(t), {}).setdefault(id(m), f"{prefix}.{tname}" if prefix else tname)
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    out: list[str] = []
    for w in weights:
        names = owners[id(tensors[w])].values() if w in tensors else [w]
        out += [n for n in names if n not in out]
    return out


def aliases_of(module) -> dict[str, set[str]]:
    """State-dict name -> every other name of the same tensor object (a module reached by two paths)."""
    by_id: dict[int, set[str]] = {}
    for n, t in list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False)):
        by_id.setdefault(id(t), set()).add(n)
    return {n: names - {n} for names in by_id.values() for n in names}


@contextmanager
def device_gather():
    """torch.gather as the device computes it. The double runs the graphs on the CPU, whose gather kernel
    mis-reads an int32 index expanded along a dim (stride 0): torch 2.13.0+cpu gathers rows [16, 16, 16, 16, 17]
    for the index [16, 17, 18, 19, 20] expanded over each row's columns, the index the extend graph's padding
    write-back (`model.extend_kv`) builds. The device lowers gather through XLA, with no such kernel, so here
    gather gets a contiguous copy of such an index; an int64 or contiguous index is passed as it is."""
    real = torch.gather

    def gather(input, dim, index, *args, **kwargs):  # noqa: A002 (torch's name)
        if index.dtype == torch.int32 and not index.is_contiguous():
            index = index.contiguous()
        return real(input, dim, index, *args, **kwargs)

    torch.gather = gather
    try:
        yield
    finally:
        torch.gather = real
