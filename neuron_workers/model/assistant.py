"""The MTP drafter: loading a `gemma4_assistant` checkpoint (Google's `gemma-4-E*-it-assistant`) or a
`gemma4_unified_assistant` one (the 12B's: transformers' `Gemma4UnifiedAssistantForCausalLM`, the same module over a
`gemma4_unified_text` stack; it drafts for `gemma4_unified` targets only).

Owns: reading the assistant's `config.json`, the key-by-key check of its weights (as `checkpoint.py` does for
the target), the module that holds them under the names of transformers' `Gemma4AssistantForCausalLM`
(`model.*` a Gemma-4 text decoder whose every layer reuses KV, `pre_projection`, `post_projection`,
`masked_embedding.centroids` / `token_ordering`; `lm_head` tied to `model.embed_tokens`), and the check that
an assistant fits its target (hidden size, the KV heads and head dims of the target's last sliding and last
full KV layer, vocabulary, window; a unified assistant's target is a unified model). It does not depend on
`Gemma4AssistantForCausalLM` itself: transformers 5.23's `Gemma4TextConfig.kv_sharing_modes` (which
`Gemma4UnifiedTextConfig` inherits) raises when every layer reuses KV, so neither class can be built as shipped.
`AllSharedTextConfig` / `AllSharedUnifiedTextConfig` answer "reuse" for every layer instead; the decoder layers
(and the text model: `Gemma4TextModel` / `Gemma4UnifiedTextModel`) are HF's own.
The draft step as a graph is `draft_graph.DraftGraph`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import Gemma4TextConfig, Gemma4UnifiedTextConfig

from neuron_workers.errors import UserError
from neuron_workers.model.checkpoint import _index_weights, _read_json, check_shapes
from neuron_workers.model.dims import FULL, SLIDING, ModelDims

ASSISTANT_TYPE = "gemma4_assistant"
UNIFIED_ASSISTANT_TYPE = "gemma4_unified_assistant"
PARAM = "draft_model"


class AllSharedTextConfig(Gemma4TextConfig):
    """The assistant's text config: every layer reads the target's K/V (`kv_sharing_modes` is all "reuse")."""

    @property
    def kv_sharing_modes(self) -> list[str]:
        return ["reuse"] * self.num_hidden_layers


class AllSharedUnifiedTextConfig(Gemma4UnifiedTextConfig):
    """A unified assistant's text config (`gemma4_unified_text`), every layer reusing the target's K/V."""

    @property
    def kv_sharing_modes(self) -> list[str]:
        return ["reuse"] * self.num_hidden_layers


# assistant model_type -> (its text config class, the target model_types it drafts for: config.json's, either layout)
KINDS = {
    ASSISTANT_TYPE: (AllSharedTextConfig, ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")),
    UNIFIED_ASSISTANT_TYPE: (AllSharedUnifiedTextConfig, ("gemma4_unified", "gemma4_unified_text")),
}


@dataclass(frozen=True)
class AssistantInfo:
    model_dir: Path
    text_config: AllSharedTextConfig | AllSharedUnifiedTextConfig
    backbone_hidden_size: int  # the target's hidden size (its embedding and last hidden state are the input)
    use_ordered_embeddings: bool  # the centroid-masked head (the real E2B / E4B assistants)
    num_centroids: int
    centroid_top_k: int  # centroid_intermediate_top_k
    weight_files: dict[str, Path]
    model_type: str = ASSISTANT_TYPE  # config.json's: a KINDS key


def read_assistant_info(model_dir: str | Path, with_weights: bool = True) -> AssistantInfo:
    """The checkpoint's config facts, and (`with_weights`) where each weight is: `compile plan` reads a
    config.json alone."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise UserError(f"no config.json in {model_dir}: not a gemma4_assistant checkpoint", param=PARAM)
    raw = _read_json(model_dir / "config.json")
    kind = raw.get("model_type")
    if kind not in KINDS:
        raise UserError(f"{model_dir} holds a {kind!r} model; draft_model needs a {ASSISTANT_TYPE!r} or "
                        f"{UNIFIED_ASSISTANT_TYPE!r} checkpoint (google/gemma-4-*-it-assistant)", param=PARAM)
    text = dict(raw.get("text_config") or {})
    text.pop("model_type", None)
    text["num_kv_shared_layers"] = text.get("num_hidden_layers", 0)
    try:
        cfg = KINDS[kind][0](**text)
    except (TypeError, ValueError) as e:
        raise UserError(f"cannot read the text config in {model_dir}/config.json: {e}", param=PARAM) from None
    if (getattr(cfg, "hidden_size_per_layer_input", 0) or getattr(cfg, "enable_moe_block", False)
            or cfg.use_double_wide_mlp):
        raise UserError(f"{model_dir}: an assistant has no per-layer inputs, MoE or double-wide MLP", param=PARAM)
    default_backbone = 3840 if kind == UNIFIED_ASSISTANT_TYPE else 1536  # transformers' config defaults
    return AssistantInfo(model_dir, cfg, int(raw.get("backbone_hidden_size", default_backbone)),
                         bool(raw.get("use_ordered_embeddings", False)), int(raw.get("num_centroids", 2048)),
                         int(raw.get("centroid_intermediate_top_k", 32)),
                         _index_weights(model_dir) if with_weights else {}, kind)


class MaskedEmbedding(nn.Module):
    """`use_ordered_embeddings`: the vocabulary in `num_centroids` clusters of equal size (`token_ordering`
    lists the token ids cluster by cluster); only the `centroid_top_k` best clusters' tokens get a logit."""

    def __init__(self, hidden: int, vocab: int, num_centroids: int, top_k: int):
        super().__init__()
        if vocab % num_centroids:
            raise UserError(f"vocab_size {vocab} is not a multiple of num_centroids {num_centroids}", param=PARAM)
        self.top_k, self.num_centroids = top_k, num_centroids
        self.centroids = nn.Linear(hidden, num_centroids, bias=False)
        self.register_buffer("token_ordering", torch.zeros(vocab, dtype=torch.long))

    def candidates(self, h: torch.Tensor, topk_op=None) -> torch.Tensor:
        """[rows, H] -> the token ids of the selected clusters [rows, top_k * vocab / num_centroids]. `topk_op`:
        pick the clusters with `tiled_topk.tiled_topk` and that per-tile op (the graphs' top-K: the Neuron build
        passes the SDK's TopK) instead of torch.topk; the same clusters, perhaps in another order."""
        scores = self.centroids(h)
        if topk_op is None:
            top = torch.topk(scores, self.top_k, dim=-1).indices
        else:
            from neuron_workers.model.tiled_topk import tiled_topk

            top = tiled_topk(scores, self.top_k, topk_op)[1]
        clusters = self.token_ordering.view(self.num_centroids, -1)
        return clusters[top].reshape(h.shape[0], -1)


class Assistant(nn.Module):
    """The assistant's weights, named as in its checkpoint."""

    def __init__(self, info: AssistantInfo):
        super().__init__()
        from transformers import Gemma4TextModel, Gemma4UnifiedTextModel

        cfg = info.text_config
        self.info = info
        self.model = (Gemma4UnifiedTextModel if info.model_type == UNIFIED_ASSISTANT_TYPE else Gemma4TextModel)(cfg)
        self.pre_projection = nn.Linear(2 * info.backbone_hidden_size, cfg.hidden_size, bias=False)
        self.post_projection = nn.Linear(cfg.hidden_size, info.backbone_hidden_size, bias=False)
        self.masked_embedding = (MaskedEmbedding(cfg.hidden_size, cfg.vocab_size, info.num_centroids,
                                                 info.centroid_top_k) if info.use_ordered_embeddings else None)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight


def load_assistant(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Assistant:
    """The assistant with its checkpoint's weights; every missing, unexpected or mis-shaped key is an error."""
    from safetensors import safe_open

    info = read_assistant_info(model_dir)
    with torch.device("meta"):
        module = Assistant(info)
    expected = {k for k in module.state_dict() if k != "lm_head.weight"}
    have = set(info.weight_files) - {"lm_head.weight"}
    missing, unexpected = sorted(expected - have), sorted(have - expected)
    if missing or unexpected:
        raise UserError(f"weights in {info.model_dir} do not match its config.json ({info.model_type}): "
                        f"{len(missing)} missing {missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}",
                        param=PARAM)
    state = {}
    for key in sorted(expected):
        with safe_open(str(info.weight_files[key]), framework="pt") as sf:
            t = sf.get_tensor(key)
        state[key] = t if key.endswith("token_ordering") else t.to(dtype)
    check_shapes(module, state)
    module.load_state_dict(state, strict=True, assign=True)
    _materialize(module, info.text_config)
    from neuron_workers.model.attention import NAME

    module.model.config._attn_implementation = NAME
    return module.eval()


def _materialize(module: Assistant, cfg) -> None:
    """Re-create the non-persistent buffers meta init left empty (RoPE tables, the embedding scale)."""
    m = module.model
    m.rotary_emb = type(m.rotary_emb)(cfg)
    m.embed_tokens.embed_scale = torch.tensor(m.embed_tokens.scalar_embed_scale)
    left = [n for n, t in list(module.named_parameters()) + list(module.named_buffers()) if t.is_meta]
    if left:
        raise UserError(f"the assistant checkpoint left {len(left)} tensors unset, e.g. {left[:3]}", param=PARAM)


def store_layers(dims: ModelDims) -> dict[str, int]:
    """The target layer whose K/V the assistant's layers of each type read: its last KV-owning layer of the
    type (transformers marks it "store")."""
    return {t: max(i for i in dims.kv_layers if dims.layer_types[i] == t) for t in (SLIDING, FULL)
            if t in dims.layer_types}


def check_pairing(info: AssistantInfo, dims: ModelDims, target_type: str | None = None) -> None:
    """Refuse an assistant made for another target, naming the first mismatch. `target_type`: the target's
    config.json model_type, when known (a unified assistant drafts for a unified target only)."""
    cfg, sto = info.text_config, store_layers(dims)
    a = ModelDims.from_hf(own_kv(cfg))
    problems = []
    if target_type is not None and target_type not in KINDS[info.model_type][1]:
        problems.append(f"a {info.model_type} checkpoint drafts for {KINDS[info.model_type][1][0]} targets, not "
                        f"a {target_type} one")
    if info.backbone_hidden_size != dims.hidden_size:
        problems.append(f"backbone_hidden_size {info.backbone_hidden_size} != the target's hidden_size "
                        f"{dims.hidden_size}")
    if cfg.vocab_size != dims.vocab_size:
        problems.append(f"vocab_size {cfg.vocab_size} != the target's {dims.vocab_size}")
    for i, t in enumerate(a.layer_types):
        if t not in sto:
            problems.append(f"layer {i} is {t}, which the target does not have")
        elif (a.kv_heads[i], a.head_dims[i]) != (dims.kv_heads[sto[t]], dims.head_dims[sto[t]]):
            problems.append(f"layer {i} ({t}) has {a.kv_heads[i]} KV heads of {a.head_dims[i]}; the target's "
                            f"layer {sto[t]} stores {dims.kv_heads[sto[t]]} of {dims.head_dims[sto[t]]}")
    if SLIDING in a.layer_types and cfg.sliding_window > dims.sliding_window:
        problems.append(f"sliding_window {cfg.sliding_window} > the target's {dims.sliding_window}")
    if problems:
        raise UserError(f"draft model {info.model_dir} does not fit the target: {problems[0]}", param=PARAM)


def own_kv(cfg: AllSharedTextConfig | AllSharedUnifiedTextConfig) -> Gemma4TextConfig:
    """The same config read as if no layer were shared (ModelDims wants a layer that stores each type), of the
    same text model type."""
    d = cfg.to_dict()
    d.pop("model_type", None)
    d["num_kv_shared_layers"] = 0
    return (Gemma4UnifiedTextConfig if isinstance(cfg, Gemma4UnifiedTextConfig) else Gemma4TextConfig)(**d)
