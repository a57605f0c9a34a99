"""Decode tokens/s of our CPU engine vs transformers' generate, same mid-size random Gemma-4, one run.

    python bench/cpu_vs_hf.py [--tokens 128] [--repeats 3]

Both decode the same greedy continuation (checked) from the same prompt; each side runs `--repeats` times,
interleaved, and the best run counts. Prints tokens/s of each and the ratio (goal: ours / HF >= 1.5).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.factory import build_engine  # noqa: E402
from neuron_workers.testing.tiny import COMMON, write_checkpoint  # noqa: E402

MID = dict(COMMON, vocab_size=32768, hidden_size=512, intermediate_size=2048, head_dim=64, global_head_dim=128,
           sliding_window=128, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
           layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2, num_kv_shared_layers=4,
           hidden_size_per_layer_input=64, vocab_size_per_layer_input=32768, use_double_wide_mlp=True,
           max_position_embeddings=2048)


def ours(engine, ids, n):
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    it = engine.generate(ids, params)
    toks = [next(it).token_id]  # prefill + first token, not timed
    t = time.perf_counter()
    toks += [e.token_id for e in it]
    return toks, (n - 1) / (time.perf_counter() - t)


def hf(model, ids, n):
    x = torch.tensor([ids])
    with torch.no_grad():
        t = time.perf_counter()
        model.generate(x, do_sample=False, max_new_tokens=1, min_new_tokens=1, pad_token_id=0)
        t1 = time.perf_counter() - t  # prefill + first token
        t = time.perf_counter()
        out = model.generate(x, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        total = time.perf_counter() - t
    return out[0, len(ids):].tolist(), (n - 1) / (total - t1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--cpu-mode", default="inductor", choices=["eager", "export", "inductor"])
    args = ap.parse_args()
    import transformers as tf

    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp) / "mid", "gemma4", MID)
        engine = build_engine(EngineConfig(model=str(path), max_context=args.max_context, cpu_mode=args.cpu_mode,
                                           max_batch=1, prefix_cache=False))  # HF reuses nothing either
        ref = tf.Gemma4ForConditionalGeneration.from_pretrained(str(path), attn_implementation="eager").eval()
        ref.generation_config.eos_token_id = None
        ids = list(range(100, 164))
        ours(engine, ids, 4)  # warm-up: inductor compiles the prefill and decode graphs here
        best_ours = best_hf = 0.0
        for _ in range(args.repeats):
            a, r_ours = ours(engine, ids, args.tokens)
            b, r_hf = hf(ref, ids, args.tokens)
            assert a == b, "greedy tokens differ"
            best_ours, best_hf = max(best_ours, r_ours), max(best_hf, r_hf)
    print(f"model: Gemma-4 E-structure, hidden {MID['hidden_size']}, {MID['num_hidden_layers']} layers, "
          f"vocab {MID['vocab_size']}, fp32, {torch.get_num_threads()} threads, {args.tokens} new tokens")
    print(f"ours (cpu engine, {args.cpu_mode}): {best_ours:8.1f} tok/s")
    print(f"transformers generate (eager): {best_hf:8.1f} tok/s")
    print(f"ratio ours / HF: {best_ours / best_hf:.2f}  (goal >= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
