"""Loading a Gemma-4 text decoder from a Hugging Face checkpoint directory.

Owns: reading `config.json` for the four on-disk layouts, the explicit checkpoint-key -> module-key
map, loud failure on any missing / unexpected / mis-shaped text weight (transformers' text-only classes
silently keep random weights on the real multimodal checkpoints), and leaving the per-layer-embedding
table on disk (see `ple.PleTable`). It does not know about graphs, KV buffers or backends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from neuron_workers.errors import UserError

PLE_KEY = "embed_tokens_per_layer.weight"

# model_type in config.json -> (text config key or None, prefix of text weights, text model_type)
LAYOUTS = {
    "gemma4": ("text_config", "model.language_model.", "gemma4_text"),
    "gemma4_unified": ("text_config", "model.language_model.", "gemma4_unified_text"),
    "gemma4_text": (None, "model.", "gemma4_text"),
    "gemma4_unified_text": (None, "model.", "gemma4_unified_text"),
}


@dataclass(frozen=True)
class CheckpointInfo:
    model_dir: Path
    model_type: str  # as in config.json
    text_config: object  # Gemma4TextConfig | Gemma4UnifiedTextConfig
    prefix: str  # checkpoint key prefix of the text decoder
    eos_token_ids: tuple[int, ...]
    weight_files: dict[str, Path]  # checkpoint key -> file
    sampling_defaults: dict  # temperature / top_k / top_p (when do_sample), repetition_penalty: generation_config


def _hf_classes(text_model_type: str):
    if text_model_type == "gemma4_text":
        from transformers import Gemma4ForCausalLM, Gemma4TextConfig

        return Gemma4TextConfig, Gemma4ForCausalLM
    from transformers import Gemma4UnifiedForCausalLM, Gemma4UnifiedTextConfig

    return Gemma4UnifiedTextConfig, Gemma4UnifiedForCausalLM


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None


def read_checkpoint_info(model_dir: str | Path) -> CheckpointInfo:
    """Parse config.json / generation_config.json and index the safetensors files."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"model directory not found: {model_dir}")
    if not (model_dir / "config.json").is_file():
        raise UserError(f"no config.json in {model_dir}: not a Hugging Face checkpoint directory")
    raw = _read_json(model_dir / "config.json")
    model_type, prefix, text_config = text_config_from_dict(raw, model_dir / "config.json")
    text_dict = raw.get("text_config", raw)
    return CheckpointInfo(model_dir, model_type, text_config, prefix, _eos_ids(model_dir, raw, text_dict),
                          _index_weights(model_dir), _sampling_defaults(model_dir))


def text_config_from_dict(raw: dict, where) -> tuple[str, str, object]:
    """(model_type, checkpoint key prefix, HF text config) from a config.json or text_config dict."""
    model_type = raw.get("model_type")
    if model_type not in LAYOUTS:
        raise UserError(f"unsupported model_type {model_type!r} in {where}; expected one of {', '.join(LAYOUTS)}")
    text_key, prefix, text_type = LAYOUTS[model_type]
    text_dict = dict(raw[text_key]) if text_key else dict(raw)
    if text_dict.get("enable_moe_block"):
        raise UserError("Gemma-4 MoE checkpoints are not supported (E2B, E4B and 12B are)")
    text_dict.pop("model_type", None)
    config_cls, _ = _hf_classes(text_type)
    try:
        return model_type, prefix, config_cls(**text_dict)
    except (TypeError, ValueError) as e:
        raise UserError(f"cannot read the text config in {where}: {e}") from None


def _eos_ids(model_dir: Path, raw: dict, text_dict: dict) -> tuple[int, ...]:
    """generation_config's eos list wins (Gemma-4: [1, 106, 50]); config.json's is the fallback."""
    gen = model_dir / "generation_config.json"
    eos = _read_json(gen).get("eos_token_id") if gen.is_file() else None
    if eos is None:
        eos = raw.get("eos_token_id", text_dict.get("eos_token_id", 1))
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _sampling_defaults(model_dir: Path) -> dict:
    """What generation_config.json asks for when a request leaves sampling unset (Gemma-4: T=1, k=64, p=0.95; a
    `repetition_penalty` too, which transformers applies greedy or not)."""
    gen = model_dir / "generation_config.json"
    cfg = _read_json(gen) if gen.is_file() else {}
    rep = cfg.get("repetition_penalty")
    if rep is not None and (isinstance(rep, bool) or not isinstance(rep, (int, float)) or not rep > 0):
        raise UserError(f"{gen}: repetition_penalty must be a positive number, got {rep!r}")
    rep = {"repetition_penalty": rep} if rep not in (None, 1.0) else {}
    if not cfg.get("do_sample"):
        return {"temperature": 0.0, **rep}
    return {**{k: cfg[k] for k in ("temperature", "top_k", "top_p") if cfg.get(k) is not None}, **rep}


def _index_weights(model_dir: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return {k: model_dir / f for k, f in _read_json(index)["weight_map"].items()}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UserError(f"no *.safetensors weights in {model_dir}")
    out = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                out.update({k: f for k in sf.keys()})
        except Exception as e:  # safetensors raises its own SafetensorError on a corrupt header
            raise UserError(f"cannot read weights file {f}: {e}") from None
    return out


def text_weight_keys(info: CheckpointInfo) -> dict[str, str]:
    """Checkpoint key -> HF module key for every text-decoder weight in the checkpoint."""
    n = len(info.prefix)
    return {k: "model." + k[n:] for k in info.weight_files if k.startswith(info.prefix)}


def build_text_model(info: CheckpointInfo, dtype: torch.dtype = torch.float32):
    """The HF causal-LM text model with checkpoint weights, lm_head tied, PLE table left out (None)."""
    _, model_cls = _hf_classes(info.text_config.model_type)
    with torch.device("meta"):
        model = model_cls(info.text_config)
    expected = {k for k in model.state_dict() if k != "lm_head.weight" and not k.endswith(PLE_KEY)}
    ignorable = {"model." + k for k in model.model._keys_to_ignore_on_load_unexpected} if hasattr(
        model.model, "_keys_to_ignore_on_load_unexpected") else set()
    state = _load_text_state(info, expected, ignorable, dtype)
    check_shapes(model, state)
    model.load_state_dict(state, strict=False, assign=True)
    model.lm_head.weight = model.model.embed_tokens.weight
    if hasattr(model.model, "embed_tokens_per_layer"):
        model.model.embed_tokens_per_layer = None  # stays on the host: neuron_workers.model.ple
    _materialize_buffers(model, info.text_config)
    from neuron_workers.model.attention import NAME

    model.config._attn_implementation = NAME  # GQA without repeat_kv copies; same math as eager
    return model.eval()


def _load_text_state(info, expected: set[str], ignorable: set[str], dtype) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    keymap = text_weight_keys(info)
    have = {v for v in keymap.values() if not v.endswith(PLE_KEY)}
    missing = sorted(expected - have)
    unexpected = sorted(have - expected - {k for k in have if _ignorable(k, ignorable)})
    if missing or unexpected:
        raise UserError(_mismatch_message(info, missing, unexpected))
    state, by_file = {}, {}
    for ck, mk in keymap.items():
        if mk in expected:
            by_file.setdefault(info.weight_files[ck], []).append((ck, mk))
    for f, pairs in by_file.items():
        with safe_open(str(f), framework="pt") as sf:
            for ck, mk in pairs:
                state[mk] = sf.get_tensor(ck).to(dtype)
    return state


def _ignorable(key: str, ignorable: set[str]) -> bool:
    # KV-shared layers carry k/v projections and norms in the real checkpoints; HF ignores them too.
    return any(key == p or key.startswith(p + ".") for p in ignorable)


def _mismatch_message(info, missing, unexpected) -> str:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing (e.g. {', '.join(info.prefix + m[6:] for m in missing[:3])})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(info.prefix + u[6:] for u in unexpected[:3])})")
    return (f"weights in {info.model_dir} do not match its config.json ({info.model_type}): "
            + "; ".join(parts))


def check_shapes(model, state: dict[str, torch.Tensor]) -> None:
    """Raise a UserError naming the first weight whose shape disagrees with the config."""
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    for k, v in state.items():
        if k in shapes and tuple(shapes[k]) != tuple(v.shape):
            raise UserError(f"weight {k} has shape {tuple(v.shape)}, config expects {tuple(shapes[k])}")


def _materialize_buffers(model, text_config) -> None:
    """Re-create the non-persistent buffers (RoPE tables, embed scales) that meta init left empty."""
    rope = model.model.rotary_emb
    model.model.rotary_emb = type(rope)(text_config)
    emb = model.model.embed_tokens
    emb.embed_scale = torch.tensor(emb.scalar_embed_scale)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise UserError(f"checkpoint left {len(left)} tensors unset, e.g. {left[:3]}")
