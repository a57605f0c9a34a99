"""EngineConfig: the one schema of a model's engine settings, and every check on them, written once.

The serve YAML (`serve_app.config.ModelSpec` takes its engine fields from here), `compile build / plan
--config` and the CLI all build an EngineConfig; a bad value is a UserError naming the field. Imports no
torch: the router process and `compile plan` read configs without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from neuron_workers.errors import UserError

BACKENDS = ("cpu", "xla", "neuron")  # xla: the traced module on a torch-xla device (backends/xla.py)
CPU_MODES = ("eager", "export", "inductor")  # see backends/cpu.py
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float64")  # float64: CPU only, for exactness checks
SUPPORTED_TP = (1, 2, 4, 8)
DEFAULT_CPU_CONTEXT = 1024
DEFAULT_MAX_BATCH = 8
MAX_BATCH_LIMIT = 256
# Chunk size of chunked prefill per backend (bench/prefill_stall.py): on CPU a chunk of 32 tokens costs about
# a decode step of the real 12B shapes' width; neuron compiles an extend graph per chunk size and prefers
# larger tiles (a 256-token chunk is the 4,096-token prefill in 16 steps). Off for a model whose sliding ring
# is smaller (the tiny test models); an explicit `prefill_chunk` is clamped to the ring.
PREFILL_CHUNK_DEFAULTS = {"cpu": 32, "tp": 32, "xla": 32, "neuron": 256}


@dataclass(frozen=True)
class EngineConfig:
    model: str  # the Hugging Face checkpoint directory
    backend: str = "cpu"
    tp: int = 1  # tensor-parallel degree; a neuron replica pins tp NeuronCores
    max_context: int | None = None  # KV-cache length (cpu default: min(model, 1024); artifacts: theirs)
    prefill_buckets: tuple[int, ...] | None = None  # prompt-length buckets (default: powers of 2)
    dtype: str = "float32"
    cpu_mode: str = "eager"  # cpu backend: eager | export | inductor
    artifacts: str | None = None  # compiled graphs (compile build --out); required by the neuron backend
    max_batch: int | None = None  # sequences decoded together (KV slots); None: the artifacts', else 8
    threads: int | None = 1  # torch host threads for this process; None leaves torch's default
    prefill_chunk: int | None = None  # prompts longer than this prefill in chunks (extend graph); 0: never;
    # None: the backend's default (PREFILL_CHUNK_DEFAULTS), at most the sliding ring
    prefix_cache: bool = True  # a finished sequence's slot keeps its KV; a prompt sharing its prefix prefills the
    # rest only (engine/prefix_cache.py; needs an extend graph: off for artifacts built without one)
    prefix_windows: int | None = None  # sliding windows kept for prefix reuse past the rings' slack
    # (engine/prefix_windows.py); None: 2 per KV slot on cpu (tp too), 0 (off) on xla; with artifacts, what the
    # build's pool holds (`compile build --prefix-windows N` sizes it); 0: off
    speculative_method: str | None = None  # "ngram": prompt-lookup drafts verified by the extend graph
    num_speculative_tokens: int | None = None  # drafts per row and step (default 4 with a method; <= ring slack)
    draft_model: str | None = None  # a gemma4_assistant (12B: gemma4_unified_assistant) checkpoint: MTP drafts
    # (engine/mtp.py); cpu (tp 1-2), xla,
    # or neuron artifacts built with it (`compile build --draft-model`)

    def __post_init__(self):
        _one_of("backend", self.backend, BACKENDS)
        _one_of("cpu_mode", self.cpu_mode, CPU_MODES)
        _one_of("dtype", self.dtype, DTYPE_NAMES)
        check_tp(self.tp)
        if self.max_batch is not None and not 1 <= self.max_batch <= MAX_BATCH_LIMIT:
            raise UserError(f"max_batch must be in [1, {MAX_BATCH_LIMIT}], got {self.max_batch}", param="max_batch")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"threads must be >= 1, got {self.threads}", param="threads")
        if self.prefill_chunk is not None and self.prefill_chunk < 0:
            raise UserError(f"prefill_chunk must be >= 0 (0: off), got {self.prefill_chunk}", param="prefill_chunk")
        _check_speculative(self.speculative_method, self.num_speculative_tokens, self.draft_model)
        if self.prefix_windows is not None and (not isinstance(self.prefix_windows, int) or self.prefix_windows < 0):
            raise UserError(f"prefix_windows must be an integer >= 0, got {self.prefix_windows!r}",
                            param="prefix_windows")

        if self.max_context is not None and self.max_context < 2:
            raise UserError(f"max_context must be >= 2, got {self.max_context}", param="max_context")
        if self.prefill_buckets is not None:
            object.__setattr__(self, "prefill_buckets", tuple(self.prefill_buckets))
            if any(b < 1 for b in self.prefill_buckets):
                raise UserError(f"prefill buckets must be positive, got {list(self.prefill_buckets)}",
                                param="prefill_buckets")
        if self.backend == "neuron" and not self.artifacts:
            raise UserError(f"the {self.backend} backend runs compiled artifacts: set `artifacts` (`--artifacts DIR` "
                            f"on the CLI), made by `python -m compile build --backend {self.backend}`",
                            param="artifacts")

    @property
    def batch(self) -> int:
        """The batch to build graphs for when no artifacts decide it."""
        return self.max_batch or DEFAULT_MAX_BATCH

    @classmethod
    def from_mapping(cls, d: dict, model: str) -> "EngineConfig":
        """The engine fields of a config mapping (a serve YAML model entry); other keys are ignored."""
        return cls(model=model, **{k: d[k] for k in ENGINE_FIELDS if k in d and d[k] is not None})


ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name != "model")


def resolve_context(max_context: int | None, max_positions: int) -> int:
    ctx = max_context or min(max_positions, DEFAULT_CPU_CONTEXT)
    if not 1 < ctx <= max_positions:
        raise UserError(f"max_context must be in [2, {max_positions}] for this model, got {ctx}", param="max_context")
    return ctx


def check_tp(tp: int) -> None:
    if tp not in SUPPORTED_TP:
        raise UserError(f"tensor-parallel degree {tp} is not supported; use one of {SUPPORTED_TP}", param="tp")


SPECULATIVE_METHODS = ("ngram",)
DEFAULT_SPECULATIVE_TOKENS = 4


def _check_speculative(method: str | None, k: int | None, draft_model: str | None = None) -> None:
    if method is not None:
        _one_of("speculative_method", method, SPECULATIVE_METHODS)
    if method is not None and draft_model is not None:
        raise UserError("draft_model (MTP drafts) and speculative_method (ngram drafts) are two drafters: set one",
                        param="draft_model")
    if k is not None and (not isinstance(k, int) or k < 0):
        raise UserError(f"num_speculative_tokens must be an integer >= 0, got {k!r}", param="num_speculative_tokens")
    if k and method is None and draft_model is None:
        raise UserError("num_speculative_tokens needs a drafter: draft_model or speculative_method (ngram)",
                        param="speculative_method")


def prefix_windows(cfg: "EngineConfig") -> int:
    """Kept sliding windows: the configured number, or 2 per KV slot on the cpu backend (0 elsewhere: the xla twin
    on request; a neuron build's pool is sized at build time, `compile build --prefix-windows N`, and serving its
    artifacts keeps what the build holds, `artifacts.load`)."""
    if not cfg.prefix_cache:
        return 0
    if cfg.prefix_windows is not None:
        return cfg.prefix_windows
    return 2 * cfg.batch if cfg.backend == "cpu" else 0


def speculative_tokens(cfg: "EngineConfig") -> int:
    """Drafts per row and step: 0 without a drafter, else the configured number or the default."""
    if cfg.speculative_method is None and cfg.draft_model is None:
        return 0
    return DEFAULT_SPECULATIVE_TOKENS if cfg.num_speculative_tokens is None else cfg.num_speculative_tokens


def _one_of(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise UserError(f"unknown {name} {value!r}; use one of {', '.join(map(str, allowed))}", param=name)


def resolve_extend_t(chunk: int, backend: str, ring: int, max_context: int) -> int:
    """T of the extend graph: the prefill chunk, or (chunking off) the backend's default chunk at most the
    ring, which the rest of a reused prefix goes through."""
    return chunk or min(PREFILL_CHUNK_DEFAULTS[backend], ring, max_context)


def resolve_prefill_chunk(value: int | None, backend: str, ring: int, max_context: int) -> int:
    """The chunk size to use: the configured one (0: off; at most the ring) or the backend's default, which
    stays off for a model whose ring is smaller than it (the tiny test models: window 8, ring 16), so those
    keep whole-prompt prefill, and the sampled tokens their tests were written against, unless asked."""
    if value is None:
        chunk = PREFILL_CHUNK_DEFAULTS[backend]
        return chunk if chunk <= min(ring, max_context) else 0
    return min(value, ring, max_context)
