"""Tiny random-weight MTP drafters (`gemma4_assistant` checkpoints, or with `unified` the 12B's kind,
`gemma4_unified_assistant`) for the tiny targets of `tiny.py`.

    python -m neuron_workers.testing.tiny_assistant --target models/gemma4-e4b-tiny --out models/e4b-assistant
    python -m neuron_workers.testing.tiny_assistant --target models/gemma4-12b-tiny --out models/12b-assistant --unified

Written by transformers' own `Gemma4AssistantForCausalLM` / `Gemma4UnifiedAssistantForCausalLM` (over a
`gemma4_unified_text` stack), so keys and config.json are the real layout. Neither class can be built as shipped
(5.23's `kv_sharing_modes` raises when every layer reuses KV): `all_layers_share_kv()` patches that property of
both text configs for the duration of the build, saying so. Each drafter has
one sliding and one full layer whose KV heads and head dims are those of the target's last sliding and last
full KV layer, and (by default) the centroid-masked head of `use_ordered_embeddings` with a random token
ordering, as the real E2B / E4B assistants. `write_assistant_config` writes a drafter's config.json alone (for a
real target's config too: what `compile plan --draft-model` reads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

from neuron_workers.testing.tiny import randomize


@contextlib.contextmanager
def all_layers_share_kv():
    """Make transformers' Gemma4TextConfig and Gemma4UnifiedTextConfig (each has its own copy of the property)
    answer "reuse" for every layer of an all-shared config (the assistant's), as the published assistants need;
    restored on exit."""
    from transformers import Gemma4TextConfig, Gemma4UnifiedTextConfig

    originals = {cls: cls.__dict__["kv_sharing_modes"] for cls in (Gemma4TextConfig, Gemma4UnifiedTextConfig)
                 if "kv_sharing_modes" in cls.__dict__}

    def patched(original):
        def modes(self):
            if self.num_kv_shared_layers and self.num_kv_shared_layers == self.num_hidden_layers:
                return ["reuse"] * self.num_hidden_layers
            return original.fget(self)

        return property(modes)

    for cls, original in originals.items():
        cls.kv_sharing_modes = patched(original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.kv_sharing_modes = original


NOT_UNIFIED = ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block")  # no such fields


def assistant_text(raw: dict, hidden: int = 32, unified: bool = False) -> dict:
    """The drafter's text config for a target (its config.json as a dict): layer 0 sliding, layer 1 full,
    each with the KV heads and head dim of the target layer it reads (`unified`: a `gemma4_unified_text` one)."""
    from neuron_workers.model.assistant import store_layers
    from neuron_workers.model.checkpoint import text_config_from_dict
    from neuron_workers.model.dims import FULL, SLIDING, ModelDims

    target_text = raw.get("text_config", raw)
    dims = ModelDims.from_hf(text_config_from_dict(raw, "the target config")[2])
    sto = store_layers(dims)
    keep = ("vocab_size", "sliding_window", "final_logit_softcapping", "rope_parameters", "max_position_embeddings",
            "rms_norm_eps", "hidden_activation", "pad_token_id", "eos_token_id", "bos_token_id")
    text = {k: target_text[k] for k in keep if k in target_text}
    text.update(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=target_text["num_attention_heads"],
                head_dim=dims.head_dims[sto[SLIDING]], num_key_value_heads=dims.kv_heads[sto[SLIDING]],
                per_layer_config={1: {"head_dim": dims.head_dims[sto[FULL]],
                                      "num_key_value_heads": dims.kv_heads[sto[FULL]]}},
                layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=2,
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, use_double_wide_mlp=False,
                enable_moe_block=False, tie_word_embeddings=True)
    if unified:
        text = {k: v for k, v in text.items() if k not in NOT_UNIFIED}
    return text


def assistant_config(raw: dict, hidden: int = 32, ordered: bool = True, num_centroids: int = 16, top_k: int = 4,
                     unified: bool = False):
    """transformers' Gemma4AssistantConfig (`unified`: Gemma4UnifiedAssistantConfig) of a drafter for the target
    whose config.json is `raw` (call it inside `all_layers_share_kv`)."""
    import transformers as tf

    text_cls, cls = ((tf.Gemma4UnifiedTextConfig, tf.Gemma4UnifiedAssistantConfig) if unified
                     else (tf.Gemma4TextConfig, tf.Gemma4AssistantConfig))
    text = text_cls(**assistant_text(raw, hidden, unified))
    return cls(text_config=text.to_dict(), backbone_hidden_size=raw.get("text_config", raw)["hidden_size"],
               use_ordered_embeddings=ordered, num_centroids=num_centroids, centroid_intermediate_top_k=top_k)


def model_class(unified: bool):
    import transformers as tf

    return tf.Gemma4UnifiedAssistantForCausalLM if unified else tf.Gemma4AssistantForCausalLM


def write_assistant_config(target_config: Path, out: Path, **kw) -> Path:
    """A drafter's config.json alone (no weights: what `compile plan --draft-model` reads) for the target config
    json `target_config` (a checkpoint's, or a bundled text config); `kw` as `assistant_config`'s."""
    with all_layers_share_kv():
        cfg = assistant_config(json.loads(Path(target_config).read_text()), **kw)
    Path(out).mkdir(parents=True, exist_ok=True)
    d = cfg.to_dict()
    d["architectures"] = [model_class(kw.get("unified", False)).__name__]
    (Path(out) / "config.json").write_text(json.dumps(d, indent=1))
    return Path(out)


def write_tiny_assistant(target_dir: Path, out: Path, seed: int = 0, ordered: bool = True,
                         num_centroids: int = 16, top_k: int = 4, hidden: int = 32, unified: bool = False) -> Path:
    from safetensors.torch import save_file

    raw = json.loads((Path(target_dir) / "config.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    with all_layers_share_kv():
        cfg = assistant_config(raw, hidden, ordered, num_centroids, top_k, unified)
        text = cfg.text_config
        model = model_class(unified)(cfg)
    randomize(model, gen)
    if ordered:
        model.masked_embedding.token_ordering.copy_(torch.randperm(text.vocab_size, generator=gen))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = cfg.to_dict()
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def write_tiny_unified_assistant(target_dir: Path, out: Path, **kw) -> Path:
    """A tiny `gemma4_unified_assistant` (the 12B's drafter kind) for a `gemma4_unified` target; `kw` as
    `write_tiny_assistant`'s."""
    return write_tiny_assistant(target_dir, out, unified=True, **kw)


def write_copying_assistant(target_dir: Path, out: Path, unified: bool = False) -> Path:
    """A drafter that predicts exactly what a target with no attention or MLP output (every `o_proj` and
    `down_proj` zero, no per-layer inputs: the benches' looping 12B-like model) decodes next: the target's
    embedding and final norm, `pre_projection` passing the token embedding through, its own layers' outputs
    zeroed. Its drafts are that target's greedy continuation, so every draft is accepted (a bench's upper
    bound, and the tests' full-acceptance case)."""
    from safetensors.torch import load_file, save_file

    from neuron_workers.model.checkpoint import read_checkpoint_info

    raw = json.loads((Path(target_dir) / "config.json").read_text())
    hidden = raw.get("text_config", raw)["hidden_size"]
    write_tiny_assistant(Path(target_dir), out, ordered=False, hidden=hidden, unified=unified)
    info = read_checkpoint_info(target_dir)
    target = load_file(str(Path(target_dir) / "model.safetensors"))
    t = load_file(str(Path(out) / "model.safetensors"))
    t["model.embed_tokens.weight"] = target[info.prefix + "embed_tokens.weight"].clone()
    t["model.norm.weight"] = target[info.prefix + "norm.weight"].clone()
    t["pre_projection.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    t = {k: v * 0 if k.endswith(("o_proj.weight", "down_proj.weight")) else v for k, v in t.items()}
    save_file(t, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
    return Path(out)


def reference_assistant(model_dir: Path):
    """transformers' own Gemma4AssistantForCausalLM (or Gemma4UnifiedAssistantForCausalLM, as config.json says) with
    the checkpoint's weights (the tests' reference)."""
    unified = json.loads((Path(model_dir) / "config.json").read_text())["model_type"] == "gemma4_unified_assistant"
    with all_layers_share_kv():
        model = model_class(unified).from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neuron_workers.testing.tiny_assistant",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the tiny target checkpoint the drafter is for")
    ap.add_argument("--out", required=True, help="folder to write the drafter into")
    ap.add_argument("--plain-head", action="store_true", help="the full LM head instead of the centroid-masked one")
    ap.add_argument("--unified", action="store_true", help="a gemma4_unified_assistant (for a gemma4_unified target)")
    args = ap.parse_args(argv)
    print(write_tiny_assistant(Path(args.target), Path(args.out), ordered=not args.plain_head, unified=args.unified))
    return 0


if __name__ == "__main__":
    sys.exit(main())
