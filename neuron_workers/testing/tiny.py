"""Tiny random-weight Gemma-4 checkpoints in the real on-disk layouts, for tests and the local default.

    python -m neuron_workers.testing.tiny --out models/     # writes gemma4-e2b-tiny, gemma4-e4b-tiny, gemma4-12b-tiny

Each mirrors one real structure (configs/model-configs has the real settings) with at least one
sliding, one full and (E-models) one KV-shared layer of each type: E2B-like (PLE, KV sharing,
double-wide MLP on shared layers, 1 KV head), E4B-like (8 query / 2 KV heads, PLE, KV sharing) and
12B-like (`gemma4_unified`: 2 KV heads on sliding layers, 1 KV head at a larger head_dim on full
layers, `attention_k_eq_v`, no PLE). Weights are written by transformers' own multimodal classes,
so keys are `model.language_model.*`, plus the unused k/v weights of KV-shared layers and one
non-text key, as in the published checkpoints. A small byte-level BPE tokenizer with the Gemma-4
control tokens at their real ids (<|turn> 105, <turn|> 106, ...) and chat template comes along.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROPE = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}
COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, head_dim=16, global_head_dim=32,
              sliding_window=8, final_logit_softcapping=30.0, rope_parameters=ROPE, max_position_embeddings=1024,
              rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1,
              bos_token_id=2, tie_word_embeddings=True)
TINY = {
    "gemma4-e2b-tiny": ("gemma4", dict(
        COMMON, num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=1,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2, num_kv_shared_layers=4,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=512, use_double_wide_mlp=True)),
    "gemma4-e4b-tiny": ("gemma4", dict(
        COMMON, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2, num_kv_shared_layers=4,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=512, use_double_wide_mlp=False)),
    "gemma4-12b-tiny": ("gemma4_unified", dict(
        COMMON, num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2,
        num_global_key_value_heads=1, attention_k_eq_v=True,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2)),
}
# the media token ids of the tiny vocabulary (tiny_tokenizer.SPECIAL). A soft token (image 69, audio 79, video 80)
# outside media is embedded as the pad token (transformers' rule), so the soft ids avoid the ids the hand-made
# prompts of the tests use (compile/smoke_tiny.py, tests/engine): their text behaviour stays what it was
MEDIA_IDS = dict(boi_token_id=67, eoi_token_id=68, image_token_id=69, boa_token_id=70, eoa_token_index=71,
                 audio_token_id=79, video_token_id=80)
# tiny towers: 4 px patches pooled 2 x 2 (E-models; the 12B-like: 8 px merged patches); the audio conformer's first
# conv keeps 128 channels (transformers sizes its projection as if they were the 128 mel bins)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2, position_embedding_size=64)
AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 4],
             conv_kernel_size=3, output_proj_dims=24)
UNIFIED_VISION = dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=64, output_proj_dims=32)
GENERATION_CONFIG = {"bos_token_id": 2, "pad_token_id": 0, "eos_token_id": [1, 106, 50], "do_sample": True,
                     "temperature": 1.0, "top_k": 64, "top_p": 0.95}


def multimodal_model(model_type: str, text: dict, media: bool = True, media_ids: dict | None = None):
    """transformers' multimodal class for the layout, with tiny vision and audio parts (`media`) or none."""
    import transformers as tf

    if model_type == "gemma4":
        text_cfg = tf.Gemma4TextConfig(**text)
        parts = dict(vision_config=tf.Gemma4VisionConfig(**VISION).to_dict(),
                     audio_config=tf.Gemma4AudioConfig(**AUDIO).to_dict()) if media else \
            dict(vision_config=None, audio_config=None)
        cfg = tf.Gemma4Config(text_config=text_cfg.to_dict(), **parts, **(media_ids or MEDIA_IDS))
        return tf.Gemma4ForConditionalGeneration(cfg)
    text_cfg = tf.Gemma4UnifiedTextConfig(**text)
    parts = dict(vision_config=tf.Gemma4UnifiedVisionConfig(**UNIFIED_VISION).to_dict(),
                 audio_config=tf.Gemma4UnifiedAudioConfig().to_dict()) if media else \
        dict(vision_config=None, audio_config=None)
    cfg = tf.Gemma4UnifiedConfig(text_config=text_cfg.to_dict(), **parts, **(media_ids or MEDIA_IDS))
    return tf.Gemma4UnifiedForConditionalGeneration(cfg)


@torch.no_grad()
def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Weights with enough spread that greedy output is varied (HF's 0.02 init gives flat logits)."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
        elif p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "embed" in name else p.shape[1] ** -0.5))
    for name, b in model.named_buffers():
        if name.endswith("layer_scalar"):
            b.copy_(torch.rand(b.shape, generator=gen) * 0.5 + 0.5)


def checkpoint_tensors(model, text: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    out = {k: v.contiguous().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    n, shared = text["num_hidden_layers"], text.get("num_kv_shared_layers", 0)
    h, hd = text["hidden_size"], text["head_dim"]
    for i in range(n - shared, n):  # the published checkpoints still carry these (HF ignores them)
        pre = f"model.language_model.layers.{i}.self_attn."
        out[pre + "k_proj.weight"] = torch.randn(hd * text["num_key_value_heads"], h, generator=gen)
        out[pre + "k_norm.weight"] = torch.ones(hd)
    return out


def write_tiny(out_dir: Path, name: str, seed: int = 0) -> Path:
    model_type, text = TINY[name]
    return write_checkpoint(Path(out_dir) / name, model_type, text, seed)


def write_checkpoint(path: Path, model_type: str, text: dict, seed: int = 0, media_ids: dict | None = None) -> Path:
    """A random-weight checkpoint of any Gemma-4 text config, in the multimodal on-disk layout; `media_ids`: the
    config's media token ids (default the tiny tokenizer's, `MEDIA_IDS`)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = multimodal_model(model_type, text, media_ids=media_ids)
    randomize(model.model.language_model, gen)  # first: the text weights do not depend on the media parts
    media_gen = torch.Generator().manual_seed(seed + 1)
    for part in ("vision_tower", "embed_vision", "audio_tower", "embed_audio"):
        if getattr(model.model, part, None) is not None:
            randomize(getattr(model.model, part), media_gen)
    path.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_tensors(model, text, gen), str(path / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    (path / "config.json").write_text(json.dumps(config, indent=1))
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=1))
    from neuron_workers.testing.tiny_tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(str(path))
    from neuron_workers.testing.media_files import write_processor_files

    write_processor_files(path, model_type)
    return path


def ensure_tiny(out_dir: str | Path) -> dict[str, Path]:
    """Write the tiny checkpoints that are missing under out_dir; return name -> path."""
    out_dir = Path(out_dir)
    paths = {}
    for name in TINY:
        p = out_dir / name
        paths[name] = p if _current(p) else write_tiny(out_dir, name)
        refresh_template(p)
    return paths


def _current(path: Path) -> bool:
    """Whether `path` holds a tiny checkpoint of this version (media weights, processor file, these media ids)."""
    if not ((path / "model.safetensors").is_file() and (path / "processor_config.json").is_file()):
        return False
    config = json.loads((path / "config.json").read_text())
    return all(config.get(k) == v for k, v in MEDIA_IDS.items())


def refresh_template(path: Path) -> None:
    """Rewrite the tokenizer of a checkpoint written by an earlier version whose chat template differs."""
    from neuron_workers.testing.tiny_tokenizer import CHAT_TEMPLATE, build_tokenizer

    saved = path / "chat_template.jinja"
    if not saved.is_file() or saved.read_text() != CHAT_TEMPLATE:
        build_tokenizer().save_pretrained(str(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neuron_workers.testing.tiny", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="models", help="folder to write the checkpoints into")
    ap.add_argument("--only", choices=sorted(TINY), help="write just this one")
    args = ap.parse_args(argv)
    for name in [args.only] if args.only else TINY:
        print(write_tiny(Path(args.out), name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
