"""Neuron backend: runs graphs compiled by neuronx-cc (through NxD ModelBuilder V2) on NeuronCores. Also owns the
list of graphs a Neuron build makes (`NeuronSpecs.graph_specs`: prefill buckets, both decodes and the extend
shapes, `ExtendShape`; with an MTP drafter the candidate graphs' `_h` variants in place of the plain ones, and
the `draft` graph), so what `neuron_build` traces is what this backend asks for, from one code path.

The only modules (with neuron_build.py) that import torch_neuronx / neuronx_distributed, and only
inside functions. WRITTEN AGAINST THE NxD CORE 0.19 SOURCE AND THE SDK DOCS, NOT RUN ON HARDWARE HERE:
tests/doubles/neuron_double.py stands in for the SDK and rejects what the real one would.

Design (one path for tp=1 and tp=2):
- the traced module is `model.graph_model.NeuronGraphModel`: KV buffers as registered state, updated
  from their old value, shared by every prefill bucket, both decode graphs and the extend graphs (no KV
  crosses the host); the draft graph reads the store layers' buffers and returns every buffer unchanged;
- TP: the same `parallel.shard_plan` / `parallel.layers.apply_tp` as the CPU path, with NxD's
  collectives at the same points (`parallel.collectives.NxdCollectives`);
- flags: --model-type=transformer --auto-cast=none --enable-saturate-infinity --target inf2, -O1 for
  prefill, the chunk-sized extend graphs and the mixed graphs, -O2 for decode, the per-position (verify) extend
  graphs and the draft graph (NxDI's choice: decode is latency bound). Compiling needs a Neuron host.
- the draft graph is called with its hidden state as the keyword `hidden` (`graph_model.draft_call`: NxDModel
  routes by the names and shapes given); artifacts built with a drafter serve with or without `draft_model` (their
  `_h` graphs return a hidden state nobody needs then).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from neuron_workers.backends.base import GraphBackend
from neuron_workers.errors import UserError
from neuron_workers.model import window_graphs
from neuron_workers.model.graph_model import ID_DTYPE, draft_call, media_call
from neuron_workers.model.spec import DECODE, DRAFT, EXTEND, MIXED, PREFILL, GraphSpec

INSTALL_HINT = ("the neuron backend needs the Neuron SDK 2.31 on an inf2 host: pip install --extra-index-url "
                "https://pip.repos.neuron.amazonaws.com -e '.[neuron]' (torch-neuronx 2.9.0.2.15.32035, "
                "neuronx-cc 2.26.6360.0, neuronx-distributed 0.19.28492)")
BASE_FLAGS = "--model-type=transformer --auto-cast=none --enable-saturate-infinity --target inf2"
# NxD Inference's flags (models/model_wrapper.py), where they apply to ours:
# - `--enable-ccop-compute-overlap`: overlap the tp=2 all-reduces / all-gathers with compute (every graph; no-op at
#   tp=1); `--cc-pipeline-tiling-factor`: how finely a collective is pipelined with that compute: NxDI's default 2,
#   1 for its token-generation and speculation graphs (few tokens: no tiles to pipeline);
# - `--vectorize-strided-dma`: vectorized DMA for strided accesses (the KV reads, the per-layer slices), every graph
#   (NxDI leaves it out only for 128k-token context encoding on trn2);
# - `--verify-hlo=true` (hlo2tensorizer): the compiler checks the HLO it is given, failing early and by name;
# - `-O1` with `--modular-flow-mac-threshold=10` for context encoding (its modular flow kicks in on every layer:
#   compile time), `-O2` for token generation (no function-call overhead between modules).
TILING = {PREFILL: 2, DECODE: 1, DRAFT: 1}


def _nxdi_flags(phase: str) -> str:
    level = "-O1" if phase == PREFILL else "-O2"
    tensorizer = (f"--enable-ccop-compute-overlap --cc-pipeline-tiling-factor={TILING[phase]} "
                  f"--vectorize-strided-dma")
    hlo2t = "--modular-flow-mac-threshold=10 --verify-hlo=true" if phase == PREFILL else "--verify-hlo=true"
    return f"{BASE_FLAGS} {level} --tensorizer-options='{tensorizer}' --internal-hlo2tensorizer-options='{hlo2t}'"


PHASE_FLAGS = {phase: _nxdi_flags(phase) for phase in (PREFILL, DECODE, DRAFT)}
MODEL_FILE, WEIGHTS_DIR = "nxd_model.pt", "weights"
LAST, LOGITS, ALL = "last", "logits", "all"  # extend variants: last position's top-K, its logits, every position's
MIXED_LAST, MIXED_LOGITS = "mixed", "mixed_logits"  # the mixed graph (every slot's decode + a chunk): top-K, logits
VARIANTS = (LAST, LOGITS, ALL, MIXED_LAST, MIXED_LOGITS)


class ExtendShape(NamedTuple):
    """One extend graph a build makes: `rows` x `t` new tokens, `variant` LAST (`extend_{R}x{T}`: top-K
    candidates of each row's last real position), LOGITS (`_logits`) or ALL (`_all`: every position's
    candidates, the verify step of speculative decoding), or the mixed graph `mixed_{B}x{T}` (rows = B, variant
    MIXED_LAST or MIXED_LOGITS: every slot's decode token and a chunk of T). The manifest keeps them as
    [rows, t, variant]; with a drafter the top-K variants are traced as `_h` (the tag says so, the variant not)."""

    rows: int
    t: int
    variant: str = LAST

    def spec(self, backend: GraphBackend) -> GraphSpec:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown extend variant {self.variant!r}: one of {', '.join(VARIANTS)}")
        if self.variant in (MIXED_LAST, MIXED_LOGITS):
            if self.rows != backend.max_batch:
                raise ValueError(f"a mixed graph has a row per slot: {self.rows} rows, batch {backend.max_batch}")
            return backend.mixed_spec(self.t, logits=self.variant == MIXED_LOGITS)
        return backend.extend_spec(self.t, self.rows, logits=self.variant == LOGITS, per_position=self.variant == ALL)


def chunk_shapes(chunk: int) -> list[ExtendShape]:
    """The extend graphs chunked prefill needs for chunk size `chunk` (0: none): one row, the last position's
    candidates, and its logits for the rows that need the whole distribution."""
    return [ExtendShape(1, chunk, LAST), ExtendShape(1, chunk, LOGITS)] if chunk else []


def mixed_shapes(batch: int, chunk: int) -> list[ExtendShape]:
    """The mixed graphs of chunk size `chunk` (0: none): a chunk and every slot's decode token in one step
    (`engine/prefill.py`, `_mixed`), top-K and logits; without them a chunk step runs the decode graph and the
    extend graph one after the other."""
    return [ExtendShape(batch, chunk, MIXED_LAST), ExtendShape(batch, chunk, MIXED_LOGITS)] if chunk else []


def verify_shapes(batch: int, k: int) -> list[ExtendShape]:
    """The verify graph of speculative decoding with k drafts (0: none): every slot, k + 1 positions, every
    position's candidates (`engine/speculate.py`)."""
    return [ExtendShape(batch, k + 1, ALL)] if k else []


def graph_flags(spec: GraphSpec) -> str:
    """neuronx-cc flags of one graph: -O1 for prefill and chunk extends (compute bound), -O2 for decode and the
    per-position (verify) extends (a few tokens a row: latency bound, as decode)."""
    if spec.phase == EXTEND:
        return PHASE_FLAGS[DECODE if spec.per_position else PREFILL]
    if spec.phase == MIXED:  # B + T tokens through every weight: the chunk's compute dominates, as a prefill's
        return PHASE_FLAGS[PREFILL]
    return PHASE_FLAGS[spec.phase]


DENSE_GATHER_VAR = "XLA_DENSE_GATHER_FACTOR"


def force_sparse_gathers() -> None:
    """XLA_DENSE_GATHER_FACTOR=0, before torch_xla lowers a gather. torch-xla 2.9 (`data_ops.cpp`, IsSparseGather)
    lowers a torch.gather whose gathered dim has <= 10 x that factor (default 8,192: 81,920) elements as a dense
    one-hot compare / select / reduce on a NEURON (or TPU) device: the ring write-back's gather over the flat
    [B*H*ring, D] view (18,432 rows on E2B at B = 32) would grow to ~1.2 G elements at T = 256, the tiled top-K's
    id gather to B x K x 8,192. The factor is read once, at the first gather, so a value set otherwise before this
    process imported torch_xla is refused (one line)."""
    import sys

    before = os.environ.get(DENSE_GATHER_VAR)
    if before not in (None, "0") and "torch_xla" in sys.modules:
        raise UserError(f"{DENSE_GATHER_VAR}={before} in this process's environment: a build lowers every gather "
                        f"sparsely (set {DENSE_GATHER_VAR}=0, or unset it, before starting)")
    os.environ[DENSE_GATHER_VAR] = "0"


def require_neuron():
    """(torch_neuronx, neuronx_distributed), or a one-line UserError saying what to install. Gathers lower
    sparsely from here on (`force_sparse_gathers`)."""
    force_sparse_gathers()
    try:
        import neuronx_distributed
        import torch_neuronx
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return torch_neuronx, neuronx_distributed


class NeuronSpecs(GraphBackend):
    """The graph specs of a Neuron build (int32 ids, a TP rank's KV heads), without running anything. With
    `hidden_states` (a build with an MTP drafter) the candidate graphs are the `_h` variants."""

    id_dtype = ID_DTYPE

    def graph_specs(self, extend=()) -> list[GraphSpec]:
        """Every graph, in trace order: the prefill buckets, `decode_logits`, the top-K `decode` (`decode_h`), then
        the extend shapes (`ExtendShape`) in the order given, then (with a drafter) `draft`."""
        specs = [self.spec(PREFILL, b) for b in self.buckets] + [self.spec(DECODE)]
        specs += [self.spec(DECODE, 1, self.candidates, hidden=self.hidden_states)] if self.candidates else []
        specs += [ExtendShape(*s).spec(self) for s in extend]
        return specs + ([self.spec(DRAFT)] if self.hidden_states else [])


class NeuronBackend(window_graphs.WindowCopies, NeuronSpecs):
    """Runs compiled artifacts: one NxDModel holding every graph, KV state on the device."""

    def __init__(self, art_dir: str | Path, dims, manifest, kv_heads=None):
        from neuron_workers.model.loader import DTYPES

        torch_neuronx, nxd = require_neuron()
        super().__init__(dims, manifest.max_context, manifest.prefill_buckets, manifest.max_batch,
                         DTYPES[manifest.dtype], kv_heads)
        self.extend_shapes = [ExtendShape(*s) for s in manifest.extend_graphs]
        self.graphs = set(manifest.graphs)  # the tags built (Manifest.check: every bucket and both decodes)
        self.hidden_states = bool(manifest.drafter)  # built with a drafter: the `_h` candidate graphs, `draft`
        self.windows = manifest.prefix_windows  # kept sliding windows the build's pool holds (its window graphs)
        self.extend_buckets = check_extend(self, self.graphs, self.extend_shapes, manifest.extend_buckets)
        # artifacts built before the mixed graphs existed: a chunk step runs decode, then extend
        self.mixed_steps = all(s in self.extend_shapes for t in self.extend_buckets
                               for s in mixed_shapes(manifest.max_batch, t))
        art_dir = Path(art_dir)
        from safetensors.torch import load_file

        self.model = nxd.NxDModel.load(str(art_dir / MODEL_FILE))
        if not isinstance(self.model, nxd.NxDModel):  # load() falls back to a bare TorchScript module on error
            raise RuntimeError(f"{art_dir / MODEL_FILE} did not load as an NxDModel (got {type(self.model).__name__}): "
                               f"rebuild the artifacts with the installed neuronx-distributed")
        self.model.set_weights([load_file(str(art_dir / WEIGHTS_DIR / f"tp{r}.safetensors"))
                                for r in range(manifest.tp)])
        self.model.to_neuron()
        self._warm_up()

    def _run(self, spec: GraphSpec, inputs):
        """One graph, chosen by its tag (NxDModel's key: `prefill_N`, `decode`, `decode_logits`, `extend_RxT...`,
        `mixed_BxT...`, `draft`)."""
        if spec.tag not in self.graphs:
            raise RuntimeError(f"these artifacts have no graph {spec.tag} (built: {', '.join(sorted(self.graphs))})"
                               + (f": rebuild with `compile build --prefill-chunk {spec.seq_len}`"
                                  if spec.phase in (EXTEND, MIXED) else ""))
        if spec.phase == DRAFT:
            args, kwargs = draft_call(inputs, bool(self.dims.ple_dim))
            out = self.model.forward(*args, model_name=spec.tag, **kwargs)
        else:
            args, kwargs = media_call(spec, tuple(inputs))
            out = self.model.forward(*args, model_name=spec.tag, **kwargs)
        if not isinstance(out, (tuple, list)):
            return out
        return out[0] if spec.num_heads == 1 else tuple(out[: spec.num_heads])

    def make_window_pool(self, entries: int) -> None:
        """The pool is the build's (`compile build --prefix-windows N`: module state of that size)."""
        if entries != self.windows:
            raise UserError(f"prefix_windows {entries}: these artifacts keep {self.windows} sliding windows (rebuild "
                            f"with `compile build --prefix-windows {entries}`, or serve {self.windows})",
                            param="prefix_windows")

    def _window(self, phase: str, *ints: int) -> None:
        self.model.forward(model_name=phase, **window_graphs.inputs(phase, *ints))

    def attach_drafter(self, assistant) -> None:
        """The drafter's weights are in the artifacts (`compile build --draft-model`; `artifacts.load` checked that
        they are this drafter's): nothing to load, only to refuse artifacts built without one."""
        self._require_draft()

    def draft(self, inputs):
        self._require_draft()
        return self._run(self.spec(DRAFT), inputs)

    def _require_draft(self) -> None:
        if DRAFT not in self.graphs:
            raise UserError("these artifacts have no draft graph: rebuild them with `compile build --draft-model "
                            "DIR` to serve an MTP drafter", param="draft_model")

    def _warm_up(self) -> None:
        """Run every graph once (the first call of each is slow); KV rows written here are replaced by the
        first prefill into them, masks hide everything a row has not written (an extend of zeros writes one token at
        position 0 of slot 0, which the first prefill or chunk into that slot rewrites; the draft writes none)."""
        for spec in self.graph_specs(self.extend_shapes):
            self._run(spec, tuple(t.zeros() for t in spec.host_inputs))
        for phase in window_graphs.INPUTS if self.windows else ():  # slot 0 / entry 0: rewritten before use
            self._window(phase, *[0] * len(window_graphs.INPUTS[phase]))

    def close(self) -> None:
        self.model = None


def check_extend(specs: NeuronSpecs, graphs: set[str], shapes: list[ExtendShape], buckets) -> tuple[int, ...]:
    """A manifest's chunk sizes `buckets`, after checking that every extend graph it lists is among the `graphs`
    built and that each chunk has both its graphs (`chunk_shapes`); a UserError naming what is missing otherwise."""
    missing = sorted({s.spec(specs).tag for s in shapes} - set(graphs))
    missing += [f"{t} ({s.variant})" for t in buckets for s in chunk_shapes(t) if s not in shapes]
    if missing:
        raise UserError(f"the artifacts' manifest lists extend graphs that were not built: {missing}: rebuild them")
    return tuple(buckets)
