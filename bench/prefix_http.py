"""The three prefix patterns through HTTP, one and two replicas, against `prefix_cache: false`, side by side in one
run (the in-process figures and the decode step: bench/prefix_patterns.py).

    python bench/prefix_http.py [--system-tokens 1000] [--answer-tokens 100]

A local Ray cluster serves the E4B-like tiny checkpoint with the real E4B window (512; ring 576; context 4096) as
four models at once: `one` (1 replica, prefix reuse with kept windows), `off` (1 replica, `prefix_cache: false`),
`two` (2 replicas, prefix-aware routing) and `spread` (2 replicas, `prefix_routing: false`: Serve's own
power-of-two choice). Prompts go through /v1/chat/completions, rendered by the Gemma-4 chat template (ours
renders what the published one does), thinking off and on.
- One replica: the three patterns (bench/prefix_patterns.py says which) on `one` and `off`: TTFT (streamed, first
  content) of each, and the hit rate of the prompt tokens the three share with what came before (the replicas'
  `ray_gemma4_prefix_cache_hit_tokens` once the metrics settle).
- Two replicas: four conversations at once, four turns each, on `two` and `spread`: the hit rate of what turns
  2-4 share with the turn before (goal >= 75%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
from agent_loop import CTX, checkpoint  # noqa: E402

MODELS = {"one": {}, "off": {"prefix_cache": False}, "two": {"min_replicas": 2, "max_replicas": 2},
          "spread": {"min_replicas": 2, "max_replicas": 2, "prefix_routing": False}}


def serve(path: Path):
    """Start the cluster and the app; returns (base URL, metrics URL)."""
    import ray
    from ray import serve as rs

    from serve_app.app import build_app
    from serve_app.config import AppArgs
    from serve_app.ops.ray_env import apply_cluster_env

    models = [{"name": name, "path": str(path), "backend": "cpu", "max_context": CTX, "max_batch": 4,
               "max_queued_requests": 64, **kw} for name, kw in MODELS.items()]
    apply_cluster_env()
    ray.init(include_dashboard=False, log_to_driver=False, _metrics_export_port=28599)
    rs.start(http_options={"host": "127.0.0.1", "port": 28598})
    rs.run(build_app(AppArgs(models=models, accelerator_resource="")), name="bench", route_prefix="/")
    return "http://127.0.0.1:28598/v1", "http://127.0.0.1:28599/metrics"


def hits(metrics: str, model: str) -> float:
    text = httpx.get(metrics, timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ray_gemma4_prefix_cache_hit_tokens_total{") and f'model="{model}"' in line)


def settled(metrics: str, model: str) -> float:
    last, stable = -1.0, 0
    for _ in range(60):
        v = hits(metrics, model)
        stable = stable + 1 if v == last else 0
        if stable >= 4:
            return v
        last = v
        time.sleep(1)
    return last


def chat(h: httpx.Client, url: str, model: str, messages: list, n: int, thinking: bool) -> tuple[str, int, float]:
    """(answer text, prompt tokens, TTFT in s) of a streamed greedy chat."""
    body = {"model": model, "messages": messages, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": thinking}}
    t0, ttft, text, prompt = time.perf_counter(), None, [], 0
    with h.stream("POST", f"{url}/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt = chunk["usage"]["prompt_tokens"]
            for c in chunk.get("choices", []):
                delta = c.get("delta", {})
                if delta.get("content") or delta.get("reasoning_content"):
                    ttft = ttft or time.perf_counter() - t0
                    text.append(delta.get("content") or "")
    return "".join(text) or "ok", prompt, ttft or time.perf_counter() - t0


def patterns(url: str, model: str, system: str, answer: int, thinking: bool) -> tuple[list[float], int]:
    """TTFTs of the three patterns and the prompt tokens they share with what came before (a fresh system
    prompt each call, so nothing of an earlier call is reused)."""
    sys_msg = {"role": "system", "content": system}
    q1 = {"role": "user", "content": "Who owns record 7, and since when?"}
    with httpx.Client(timeout=600) as h:
        a1, p1, _ = chat(h, url, model, [sys_msg, q1], answer, thinking)
        _, p_1, t1 = chat(h, url, model, [sys_msg, {"role": "user", "content": "And record 8?"}], 8, thinking)
        turn2 = [sys_msg, q1, {"role": "assistant", "content": a1 + " (re-rendered)"},
                 {"role": "user", "content": "And who changed it last?"}]
        _, p2, t2 = chat(h, url, model, turn2, answer, thinking)
        _, _, t3 = chat(h, url, model, turn2, 8, thinking)
    shared = (p1 - 8) + p1 + (p2 - 1)  # the system turn (about), turn 1's prompt, the repeated prompt
    return [t1, t2, t3], shared


def conversations(url: str, model: str, system: str) -> int:
    """Four at once, four turns each; the tokens turns 2-4 share with the turn before."""
    def one(i: int) -> int:
        story = " ".join(f"Line {j} of story {i} is about a {['cat', 'ship', 'tree', 'cloud'][i]}." for j in range(60))
        msgs, prev, shared = [{"role": "system", "content": system[:200]}, {"role": "user", "content": story}], 0, 0
        with httpx.Client(timeout=600) as h:
            for t in range(4):
                text, p, _ = chat(h, url, model, msgs, 16, False)
                shared += prev - 1 if prev else 0
                prev = p
                msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Go on ({t})."}]
        return shared

    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(one, range(4)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--answer-tokens", type=int, default=100)
    args = ap.parse_args(argv)
    url, metrics = serve(checkpoint())
    rule = "Answer precisely, cite the records you used, and keep every answer under a hundred words. "
    system = lambda salt: f"[{salt}] " + rule * max(1, args.system_tokens // 18)
    with httpx.Client(timeout=600) as h:  # warm-up: every replica's graphs
        for m in MODELS:
            for _ in range(4 if m in ("two", "spread") else 1):
                chat(h, url, m, [{"role": "user", "content": "warm up " * 300}], 2, False)
    print("one replica: thinking, TTFT ms of patterns 1 / 2 / 3 (reuse on, off), ratio on/off, hit rate")
    salt = 0
    for thinking in (False, True):
        row = {}
        for m in ("one", "off"):
            before = settled(metrics, m)
            salt += 1
            ttfts, shared = patterns(url, m, system(salt), args.answer_tokens, thinking)
            row[m] = (ttfts, (settled(metrics, m) - before) / shared)
        on, off = row["one"][0], row["off"][0]
        cells = "  ".join(f"{a * 1e3:6.0f} / {b * 1e3:6.0f}" for a, b in zip(on, off))
        ratio = statistics.mean(a / b for a, b in zip(on, off))
        print(f"  {'on ' if thinking else 'off'}  {cells}  {ratio:5.2f}x  {row['one'][1]:5.1%} vs {row['off'][1]:5.1%}")
    print("two replicas: four conversations x four turns: hit rate of what turns 2-4 share")
    for m in ("two", "spread"):
        before = settled(metrics, m)
        salt += 1
        shared = conversations(url, m, system(salt))
        label = "prefix routing" if m == "two" else "Serve's default routing"
        print(f"  {label:24s} {(settled(metrics, m) - before) / shared:5.1%} of {shared} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
