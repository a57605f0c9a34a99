"""`compile plan`: does a model fit the NeuronCores at a given tp / batch / context, and if not, why.

Per core (16 GiB of HBM: an Inferentia2 chip has 32 GiB for its 2 cores):
- weights: counted from the config analytically (not from a model object), bf16, split by the shard
  plan; the PLE table is left out (it stays on the host);
- KV cache: full layers hold max_context slots, sliding layers a ring of the window plus its slack
  (`dims.RING_SLACK`: 64 positions), KV-shared layers none;
- activations / scratch (an estimate): a fixed runtime reserve plus the larger of the largest prefill
  bucket's transients (one prompt: fp32 attention scores of one layer, MLP intermediates, hidden states)
  and the decode step's (`batch` rows, attention over the whole context) and the extend graphs' (a prefill
  chunk; the speculative verify shape, every row x 8 positions; the mixed graph, B + T tokens), plus `batch`
  rows of fp32 logits (both decode graphs compute them on the device: `decode` keeps only each row's top-K of them, the
  `decode_logits` variant returns them);
- device -> host per decode step: `decode` returns K candidates a row (bf16 values + int32 ids),
  `decode_logits` (only for steps where a row needs the whole distribution) `batch x vocab` bf16 logits.
Host: the PLE table (memory-mapped, shared by all replicas of a model) against the instance's RAM.

Media encoders (`media_plan`, its own line): the released vision / audio towers and their embedders into the
text width, bf16, from `MEDIA_ENCODERS` (the config values of transformers 5.23's `Gemma4VisionConfig` /
`Gemma4AudioConfig` / `Gemma4Unified*Config`, which are the checkpoints'; counted, not guessed:
tests/compile/test_plan.py builds the classes on the meta device). If they ran as Neuron graphs of their own,
whole on each core of the replica, their weights would sit beside the text weights / KV; their graph's transients
(an estimate, as the text graphs': one image at the 280-token default bucket and at the 1120 maximum, 30 s of audio)
share the activations' scratch, since a core runs one graph at a time. docs/media.md has the decision.

With an MTP drafter (`--draft-model DIR`, a `gemma4_assistant` or `gemma4_unified_assistant` checkpoint's
config.json, checked against the target as at load; real assistants' sizes are not in our references, so nothing is
printed about one unless given): its weights join the core's (bf16,
`token_ordering` int32; no PLE, no KV: its layers read the target's store layers), and `draft_read` is what one
draft step of `batch` rows reads from HBM: its layers, norms and projections, the head rows it scores (with
`use_ordered_embeddings`: each row's `centroid_top_k` clusters of the vocabulary, else the whole tied embedding),
the target's embedding rows, and the K/V of the target's last full and last sliding KV layer (whole buffers: the
graph's shapes are static). Its transients (`batch` rows, one query over the context, the target's query heads)
are within the decode step's, which the activations already count.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from neuron_workers.config import PREFILL_CHUNK_DEFAULTS
from neuron_workers.errors import UserError
from neuron_workers.model.dims import FULL, SLIDING, ModelDims, decode_candidates
from neuron_workers.parallel.shard_plan import ShardPlan, intermediate_sizes, make_plan

GIB = 1024**3
HBM_PER_CORE = 16 * GIB
RUNTIME_RESERVE = 1 * GIB
BF16 = 2
INSTANCES = {"inf2.xlarge": (2, 16), "inf2.8xlarge": (2, 128), "inf2.24xlarge": (12, 384), "inf2.48xlarge": (24, 768)}


@dataclass
class Plan:
    model_type: str
    tp: int
    batch: int
    max_context: int
    instance: str
    weights_per_core: int
    kv_per_core: int
    activations_per_core: int
    hbm_per_core: int
    ple_host: int
    host_ram: int
    fits: bool
    reasons: list[str]
    largest_context: int | None
    decode_out_candidates: int = 0  # bytes device -> host per decode step, `decode` (top-K candidates)
    decode_out_logits: int = 0  # the same for `decode_logits` (full logits)
    drafter: dict | None = None  # an MTP drafter's `drafter_plan`: name, weights, draft_read
    window_per_core: int = 0  # bytes of one kept sliding window (prefix_windows) on a core
    media: dict | None = None  # `media_plan`: the media encoders' bytes and whether they fit beside the above

    @property
    def total_per_core(self) -> int:
        drafter = self.drafter["weights"] if self.drafter else 0
        return self.weights_per_core + self.kv_per_core + self.activations_per_core + drafter


def load_text_config(path: str | Path):
    """A checkpoint directory (config.json) or a config json file (full or text_config only)."""
    from neuron_workers.model.checkpoint import text_config_from_dict

    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise UserError(f"no model config at {path}: give a checkpoint directory or a config .json file")
    try:
        raw = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{f} is not valid JSON: {e}") from None
    return text_config_from_dict(raw, f)[2]


BUNDLED = Path(__file__).resolve().parent.parent / "configs" / "model-configs"


def config_or_bundled(path: str | Path, note=print):
    """The checkpoint's own text config when it is there; else the bundled real config whose name the
    checkpoint directory's starts with (`/models/gemma-4-E2B-it` -> `gemma-4-E2B.text_config.json`), saying
    so through `note`; else the error of `load_text_config`."""
    p = Path(path)
    if (p / "config.json").is_file() or p.is_file():
        return load_text_config(p)
    name = p.name.lower()
    for f in sorted(BUNDLED.glob("*.text_config.json")):
        if name.startswith(f.name.removesuffix(".text_config.json").lower()):
            note(f"note: no model config at {path}: planning with the bundled {f.relative_to(BUNDLED.parent.parent)}")
            return load_text_config(f)
    return load_text_config(p)


def layer_params(cfg, dims: ModelDims, i: int, inter: int) -> dict[str, int]:
    """Parameter count of layer i, by how it is split under TP (col/row: split, kv: split or replicated)."""
    h, hd, hq, hkv = dims.hidden_size, dims.head_dims[i], dims.num_attention_heads, dims.kv_heads[i]
    split = 2 * h * hq * hd + 3 * h * inter  # q, o; gate, up, down
    rep = hd + 4 * h + 1  # q_norm, 4 layer norms, layer_scalar
    kv = 0
    if dims.kv_source[i] == i:
        has_v = not (getattr(cfg, "attention_k_eq_v", False) and dims.layer_types[i] == FULL)
        kv = h * hkv * hd * (2 if has_v else 1)
        rep += hd  # k_norm (v_norm has no weight)
    if dims.ple_dim:
        rep += 2 * h * dims.ple_dim + h  # per-layer input gate, projection, norm
    return {"split": split, "kv": kv, "rep": rep}


def model_params(cfg, dims: ModelDims) -> dict[str, int]:
    """Model-level parameters: the tied embedding (vocab-split), replicated norms and PLE projection, PLE table.
    The embedding is counted once: the LM head reads the embedding module (graph_model.TiedHead, and
    VocabParallelHead at tp>1), so the device holds one copy; `compile build` warns if a trace takes it twice."""
    ple = dims.num_layers * dims.ple_dim
    return {"embed": dims.vocab_size * dims.hidden_size,
            "rep": dims.hidden_size + (dims.hidden_size * ple + dims.ple_dim if ple else 0),
            "ple_table": dims.ple_vocab * ple}


def weights_per_core(cfg, dims: ModelDims, plan: ShardPlan, bytes_per: int = BF16) -> int:
    inter = intermediate_sizes(cfg)
    total = 0
    for i in range(dims.num_layers):
        p = layer_params(cfg, dims, i, inter[i])
        total += p["split"] // plan.tp + p["rep"] + (p["kv"] if plan.layers[i].kv_replicated else p["kv"] // plan.tp)
    m = model_params(cfg, dims)
    return (total + m["embed"] // plan.tp + m["rep"]) * bytes_per


def kv_per_core(dims: ModelDims, plan: ShardPlan, batch: int, ctx: int, bytes_per: int = BF16) -> int:
    """Full layers keep every position of the context, sliding layers a ring of the window."""
    per_token = plan.kv_bytes_per_token(bytes_per)
    return batch * (per_token[FULL] * ctx + per_token[SLIDING] * dims.ring_size(ctx))


EXTEND_CHUNK = PREFILL_CHUNK_DEFAULTS["neuron"]  # T of chunked prefill's extend graph on Neuron
EXTEND_VERIFY = 8  # T of the widest speculative verify extend counted


def activations_per_core(dims: ModelDims, plan: ShardPlan, batch: int, bucket: int, ctx: int | None = None) -> int:
    hq = dims.num_attention_heads // plan.tp
    inter = max(s.intermediate for s in plan.layers)

    def transients(rows: int, q: int, keys: int) -> int:
        return rows * hq * q * keys * 4 + 3 * rows * q * inter * BF16 + 4 * rows * q * dims.hidden_size * 4

    prefill = transients(1, bucket, bucket)  # one prompt at a time, into its slot
    decode = transients(batch, 1, ctx or bucket)
    # the extend graphs: a prefill chunk (one row, `EXTEND_CHUNK` queries over the context plus the chunk), the
    # verify shape of speculative decoding (every row, `EXTEND_VERIFY` queries, per-position candidates) and the
    # mixed graph (the chunk beside every row's decode token; counted as B + T queries over every key: a bound)
    keys = (ctx or bucket) + EXTEND_CHUNK
    extend = max(transients(1, EXTEND_CHUNK, keys), transients(batch, EXTEND_VERIFY, keys),
                 transients(1, batch + EXTEND_CHUNK, keys))  # the mixed graph: B decode tokens + a chunk, one axis
    return RUNTIME_RESERVE + max(prefill, decode, extend) + batch * dims.vocab_size * 4


def make_plan_report(cfg, tp: int, batch: int, ctx: int, instance: str, bucket: int | None = None,
                     drafter=None) -> Plan:
    """`drafter`: an MTP drafter's `AssistantInfo` (`load_drafter_info`), or None."""
    if instance not in INSTANCES:
        raise UserError(f"unknown instance {instance!r}; use one of {', '.join(INSTANCES)}")
    dims = ModelDims.from_hf(cfg)
    if not 1 < ctx <= dims.max_position_embeddings:
        raise UserError(f"max context must be in [2, {dims.max_position_embeddings}], got {ctx}")
    plan = make_plan(dims, intermediate_sizes(cfg), tp)
    cores, ram_gib = INSTANCES[instance]
    if drafter is not None:
        from neuron_workers.model.assistant import check_pairing

        check_pairing(drafter, dims, cfg.model_type)  # a drafter for another target (or of the wrong kind) refused
    draft = drafter_plan(drafter, dims, batch, ctx, plan) if drafter is not None else None
    w = weights_per_core(cfg, dims, plan)
    wd = w + (draft["weights"] if draft else 0)
    fit = lambda c: wd + kv_per_core(dims, plan, batch, c) + activations_per_core(  # noqa: E731
        dims, plan, batch, min(bucket or c, c), c) <= HBM_PER_CORE
    kv = kv_per_core(dims, plan, batch, ctx)
    act = activations_per_core(dims, plan, batch, min(bucket or ctx, ctx), ctx)
    ple = model_params(cfg, dims)["ple_table"] * BF16
    reasons = []
    if wd + kv + act > HBM_PER_CORE:
        reasons.append(f"needs {(wd + kv + act) / GIB:.2f} GiB per core, a NeuronCore has {HBM_PER_CORE / GIB:.0f} GiB")
    if tp > cores:
        reasons.append(f"tp={tp} needs {tp} NeuronCores, {instance} has {cores}")
    if ple > ram_gib * GIB * 0.8:
        reasons.append(f"the PLE table ({ple / GIB:.1f} GiB) exceeds 80% of {instance}'s {ram_gib} GiB RAM")
    out_top, out_logits = decode_output_bytes(dims, batch)
    report = Plan(cfg.model_type, tp, batch, ctx, instance, w, kv, act, HBM_PER_CORE, ple, ram_gib * GIB,
                  not reasons, reasons, _largest(fit, dims.max_position_embeddings), out_top, out_logits, draft,
                  dims.window_bytes(BF16, tp))
    report.media = media_plan(cfg.model_type, dims.hidden_size, report)
    return report


# The released media encoders, from the config values (transformers 5.23 defaults = the checkpoints' values):
# E2B / E4B (`gemma4`): vision tower hidden 768, 16 layers, MLP 3072, 12 heads x 64, patch 16, pooling 3x3,
# position table 10240; audio conformer hidden 1024, 12 layers, 8 heads, subsampling channels (128, 32), conv kernel
# 5, chunk 12 / left context 13, output_proj_dims 1536. The embedders (RMSNorm without scale + Linear, no bias) map
# `out` features to the text width. The 12B (`gemma4_unified`): no towers; the vision embedder (48x48x3 = 6912
# patch -> LN / Dense 3840 / LN / 1120x2x3840 factorized position table / LN) then RMSNorm + Linear 3840 -> text
# width; audio: 640-sample frames -> RMSNorm + Linear -> text width. `tower`: parameters not scaling with the text
# width; `out`: the embedder's input width; transients: (tokens, heads, MLP width, width, keys a query sees) of the
# largest graph, for the same estimate as the text graphs' (None: full attention over all tokens).
MEDIA_ENCODERS = {
    "gemma4_text": {
        "vision": {"tower": 167_364_608, "out": 768, "tokens_per_soft": 9, "heads": 12, "mlp": 3072, "width": 768,
                   "keys": None},
        "audio": {"tower": 304_824_608, "out": 1536, "tokens_per_second": 25, "heads": 8, "mlp": 4096,
                  "width": 1024, "keys": 24},
    },
    "gemma4_unified_text": {
        "vision": {"tower": 35_176_704, "out": 3840, "tokens_per_soft": 1, "heads": 0, "mlp": 6912, "width": 3840,
                   "keys": 0},
        "audio": {"tower": 0, "out": 640, "tokens_per_second": 25, "heads": 0, "mlp": 640, "width": 640, "keys": 0},
    },
}
IMAGE_BUDGETS = (70, 140, 280, 560, 1120)  # the image processors' allowed max_soft_tokens; 280 is their default
DEFAULT_IMAGE_BUDGET, MAX_AUDIO_SECONDS = 280, 30


def media_params(model_type: str, text_hidden: int) -> dict[str, int]:
    """{vision, audio}: each encoder's parameters with its embedder into `text_hidden` ({} for an unknown kind)."""
    enc = MEDIA_ENCODERS.get(model_type, {})
    return {k: e["tower"] + e["out"] * text_hidden for k, e in enc.items()}


def media_transients(e: dict, tokens: int) -> int:
    """The same estimate as the text graphs' transients, for one item of `tokens` tokens through an encoder."""
    keys = tokens if e["keys"] is None else e["keys"]
    return e["heads"] * tokens * keys * 4 + 3 * tokens * e["mlp"] * BF16 + 4 * tokens * e["width"] * 4


def media_plan(model_type: str, text_hidden: int, p: Plan) -> dict | None:
    """The media encoders' weights (bf16) and graph transients, and whether they fit on a core beside the text
    model's weights / KV (the transients within the activations' scratch where it is larger). None for an
    unknown kind."""
    enc = MEDIA_ENCODERS.get(model_type)
    if enc is None:
        return None
    weights = sum(media_params(model_type, text_hidden).values()) * BF16
    vis, aud = enc["vision"], enc["audio"]
    trans = {f"image_{b}": media_transients(vis, b * vis["tokens_per_soft"]) for b in (DEFAULT_IMAGE_BUDGET, 1120)}
    trans["audio_30s"] = media_transients(aud, MAX_AUDIO_SECONDS * aud["tokens_per_second"])
    base = p.total_per_core - p.activations_per_core + weights
    fits = {k: base + max(p.activations_per_core, RUNTIME_RESERVE + t) <= HBM_PER_CORE for k, t in trans.items()}
    return {"weights": weights, "vision_weights": media_params(model_type, text_hidden)["vision"] * BF16,
            "audio_weights": media_params(model_type, text_hidden)["audio"] * BF16, "transients": trans,
            "fits": fits, "free_after": HBM_PER_CORE - base - p.activations_per_core}


def load_drafter_info(path: str | Path):
    """An MTP drafter's config facts from its checkpoint directory (config.json; weights not needed)."""
    from neuron_workers.model.assistant import read_assistant_info

    return read_assistant_info(path, with_weights=False)


def drafter_params(info) -> dict[str, int]:
    """The drafter's parameter counts, analytically from its config: `layers` (attention without K/V
    projections: its layers read the target's; MLP; norms), `rest` (final norm, pre/post projections,
    centroids), `embed` (its tied vocab x hidden head) and `ordering` (token_ordering, int32 on the device)."""
    cfg = info.text_config
    h, hq, n = cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
    inter = intermediate_sizes(cfg)
    layers = 0
    for i in range(n):
        hd = cfg.per_layer_config[i].head_dim
        layers += 2 * h * hq * hd + 3 * h * inter[i] + hd + 4 * h + 1  # q, o; gate, up, down; q_norm; norms; scalar
    ordered = info.use_ordered_embeddings
    rest = h + 3 * info.backbone_hidden_size * h + (h * info.num_centroids if ordered else 0)
    return {"layers": layers, "rest": rest, "embed": cfg.vocab_size * h, "ordering": cfg.vocab_size if ordered else 0}


def drafter_plan(info, dims: ModelDims, batch: int, ctx: int, plan: ShardPlan) -> dict:
    """{name, weights (HBM bytes per core), draft_read (HBM bytes one draft step of `batch` rows reads on a core),
    head_rows (the embedding rows a row scores)}. At tp > 1 its layers are split over the ranks (as
    `parallel.layers.apply_tp_assistant`), the rest whole on every core, and it reads each rank's K/V."""
    from neuron_workers.model.assistant import store_layers

    p, h = drafter_params(info), info.text_config.hidden_size
    p = {**p, "layers": p["layers"] // plan.tp}
    weights = (p["layers"] + p["rest"] + p["embed"]) * BF16 + p["ordering"] * 4
    vocab = info.text_config.vocab_size
    rows = info.centroid_top_k * vocab // info.num_centroids if info.use_ordered_embeddings else vocab
    head = batch * rows * (h * BF16 + 4) if info.use_ordered_embeddings else vocab * h * BF16
    sto = store_layers(dims)
    kv = sum(2 * batch * plan.kv_heads[j] * dims.head_dims[j] * (ctx if t == FULL else dims.ring_size(ctx)) * BF16
             for t, j in sto.items())
    read = (p["layers"] + p["rest"]) * BF16 + head + batch * dims.hidden_size * BF16 + kv
    return {"name": Path(info.model_dir).name, "weights": weights, "draft_read": read, "head_rows": rows}


def decode_output_bytes(dims: ModelDims, batch: int) -> tuple[int, int]:
    """Bytes one decode step returns to the host: (`decode`: K bf16 values + K int32 ids a row,
    `decode_logits`: the bf16 logits)."""
    return batch * decode_candidates(dims) * (BF16 + 4), batch * dims.vocab_size * BF16


def _largest(fit, limit: int, step: int = 128) -> int | None:
    """The largest multiple of `step` (up to the model's limit) whose plan fits, or None."""
    lo, hi = 0, limit // step
    if not fit(step):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fit(mid * step) else (lo, mid - 1)
    return lo * step


def format_plan(p: Plan) -> str:
    g = lambda b: f"{b / GIB:6.2f} GiB"  # noqa: E731
    d = p.drafter
    drafter = f" + MTP drafter {g(d['weights'])}" if d else ""
    lines = [f"{p.model_type} tp={p.tp} batch={p.batch} max_context={p.max_context} on {p.instance}",
             f"  per NeuronCore: weights {g(p.weights_per_core)}{drafter} + KV cache {g(p.kv_per_core)} + "
             f"activations/scratch (est.) {g(p.activations_per_core)} = {g(p.total_per_core)} of {g(p.hbm_per_core)}",
             f"  host: PLE table {g(p.ple_host)} (memory-mapped, shared by replicas) of {g(p.host_ram)} RAM",
             f"  device -> host per decode step: {p.decode_out_candidates / 1024:.1f} KiB (top-K candidates; "
             f"{p.decode_out_logits / 2**20:.1f} MiB when a row needs the full logits)",
             f"  largest max_context that fits: {p.largest_context if p.largest_context else 'none'}",
             f"  kept sliding windows (compile build --prefix-windows N; the cpu backend keeps 2 a slot): "
             f"{p.window_per_core / 2**20:.1f} MiB each per core; "
             f"{max(0, p.hbm_per_core - p.total_per_core) // max(p.window_per_core, 1)} would fit beside the above "
             f"(2 a slot: {2 * p.batch * p.window_per_core / GIB:.2f} GiB)"]
    if p.media:
        lines.append(format_media(p.media))
    if d:
        lines.insert(2, f"  MTP drafter {d['name']} (it adds no KV): one draft step reads "
                        f"{d['draft_read'] / 2**20:.1f} MiB of HBM ({p.batch} rows x {d['head_rows']} head rows, "
                        f"its layers, the store layers' KV)")
    lines.append("  fits" if p.fits else "  DOES NOT FIT: " + "; ".join(p.reasons))
    return "\n".join(lines)


def format_media(m: dict) -> str:
    mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    t, f = m["transients"], m["fits"]
    yes = lambda k: "fits" if f[k] else "does not fit"  # noqa: E731
    return (f"  media encoders if run as Neuron graphs (bf16, whole on each core; docs/media.md says where they run): "
            f"vision {mib(m['vision_weights'])} + audio {mib(m['audio_weights'])} = {mib(m['weights'])}, "
            f"{m['free_after'] / GIB:.2f} GiB of the core left after them\n"
            f"    their graphs' transients (est., sharing the activations' scratch): image@280 {mib(t['image_280'])} "
            f"{yes('image_280')}, image@1120 {mib(t['image_1120'])} {yes('image_1120')}, audio 30 s "
            f"{mib(t['audio_30s'])} {yes('audio_30s')}")


def plan_json(p: Plan) -> str:
    d = {**asdict(p), "total_per_core": p.total_per_core}
    if not p.drafter:
        d.pop("drafter")  # nothing about a drafter unless one was given
    return json.dumps(d)
