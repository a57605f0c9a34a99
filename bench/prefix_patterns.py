"""The three prefix patterns real clients send, past the sliding window, with kept windows, with the rings alone
and with prefix reuse off, side by side in one run; and a decode step with and without kept windows.

    python bench/prefix_patterns.py [--system-tokens 1000] [--answer-tokens 100] [--repeats 3]

The model is the E4B-like tiny checkpoint with the real E4B sliding window (512; ring 576), context 4096, on the
cpu backend; prompts are rendered by the Gemma-4 chat template (ours renders exactly what the published one does),
thinking off and on. Per pattern:
  1. a ~1,000-token system prompt, a question, a 100-token answer; then the same system prompt, a new question;
  2. the next turn of that conversation, its answer re-rendered as text (not the generated ids: what the templates
     do when they strip a thought), and a new user turn;
  3. the same prompt again after its 100-token answer.
Printed: the tokens the prompt shares with what the engine kept, the tokens reused in each setting, TTFT in each
setting and the ratio with kept windows to prefix reuse off (goal: reuse >= 75% of shared, TTFT <= 0.3x), and
whether every setting generated the same tokens (it must). Then the median decode step over 4 rows with kept
windows and without (goal: the same within noise), and the pool's bytes per window for the real sizes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from agent_loop import CTX, checkpoint  # noqa: E402

from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.engine.prefix_cache import common_prefix  # noqa: E402
from neuron_workers.factory import build_engine  # noqa: E402

SETTINGS = {"windows": {}, "rings": {"prefix_windows": 0}, "off": {"prefix_cache": False}}


def system_prompt(engine, tokens: int) -> str:
    rule = "Answer precisely, cite the records you used, and keep every answer under a hundred words. "
    lines = 1
    while len(engine.encode_chat([{"role": "system", "content": rule * lines}])) < tokens:
        lines += 1
    return rule * lines


def run(engine, ids: list[int], n: int) -> tuple[list[int], float, int]:
    """(tokens, TTFT in s, prompt tokens reused)."""
    hits = engine.prefix.hit_tokens if engine.prefix else 0
    seq = engine.new_sequence(ids, SamplingParams(max_tokens=n, ignore_eos=True))
    t0, ttft = time.perf_counter(), None
    for _ in engine.run_all([seq]):
        ttft = ttft or time.perf_counter() - t0
    return seq.output_ids, ttft, (engine.prefix.hit_tokens if engine.prefix else 0) - hits


def patterns(engine, system: str, answer: int, thinking: bool) -> list[tuple[str, int, list, float, int]]:
    """(pattern, shared tokens, tokens, TTFT, reused) of the three patterns, from a cold engine."""
    for slot in list(engine.prefix.kept) if engine.prefix else []:
        engine.prefix.drop(slot)
    kw = {"enable_thinking": thinking}
    chat = lambda msgs: engine.encode_chat(msgs, **kw)
    sys_msg = {"role": "system", "content": system}
    p1 = chat([sys_msg, {"role": "user", "content": "Who owns record 7, and since when?"}])
    a1, _, _ = run(engine, p1, answer)
    kept, out = p1 + a1[:-1], []
    q = chat([sys_msg, {"role": "user", "content": "List the records team 4 changed last week."}])
    out.append(("1 system prompt", common_prefix(q, kept), *run(engine, q, 8)))
    reply = "Record 7 belongs to team 3; they have owned it since March, as the audit log shows."
    p2 = chat([sys_msg, {"role": "user", "content": "Who owns record 7, and since when?"},
               {"role": "assistant", "content": reply}, {"role": "user", "content": "And record 8?"}])
    out.append(("2 re-rendered", common_prefix(p2, kept), *run(engine, p2, answer)))
    kept = p2 + out[-1][2][:-1]
    out.append(("3 repeated", common_prefix(p2, kept), *run(engine, p2, 8)))
    return out


def decode_step_ms(engine, rows: int = 4, steps: int = 48) -> float:
    """The median decode step over `rows` running sequences."""
    seqs = [engine.new_sequence([2] + [(7 * i + r) % 400 + 20 for i in range(40)],
                                SamplingParams(max_tokens=steps + 2, ignore_eos=True)) for r in range(rows)]
    for s in seqs:
        engine.add(s)
    while not all(s.output_ids for s in seqs):  # the prefills (chunked: one piece a step), windows kept
        engine.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    while engine.has_work:
        engine.step()
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--answer-tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting; the median TTFT is printed")
    ap.add_argument("--prefill-chunk", type=int, default=None, help="default: the cpu backend's (32)")
    args = ap.parse_args(argv)
    path = checkpoint()
    engines = {name: build_engine(EngineConfig(model=str(path), max_context=CTX, max_batch=4,
                                               prefill_chunk=args.prefill_chunk, **kw))
               for name, kw in SETTINGS.items()}
    system = system_prompt(engines["off"], args.system_tokens)
    for e in engines.values():
        run(e, e.encode_chat([{"role": "user", "content": "warm up " * 300}]), 2)
    for thinking in (False, True):
        res = {name: [patterns(e, system, args.answer_tokens, thinking) for _ in range(args.repeats)]
               for name, e in engines.items()}
        print(f"thinking {'on' if thinking else 'off'}: pattern, shared, reused (windows / rings), TTFT ms "
              "(windows / rings / off), windows/off, same tokens")
        for i in range(3):
            name, shared = res["windows"][0][i][:2]
            ttft = {k: statistics.median(r[i][3] for r in v) for k, v in res.items()}
            same = len({tuple(r[i][2]) for v in res.values() for r in v}) == 1
            print(f"  {name:16s} {shared:5d}  {res['windows'][0][i][4]:5d} / {res['rings'][0][i][4]:5d}  "
                  f"{ttft['windows'] * 1e3:7.1f} / {ttft['rings'] * 1e3:7.1f} / {ttft['off'] * 1e3:7.1f}  "
                  f"{ttft['windows'] / ttft['off']:5.2f}x  {'same' if same else 'DIFFERENT'}")
    steps = {"windows": [], "rings": []}
    for _ in range(args.repeats):  # taking turns, so drift hits both alike
        for name in steps:
            steps[name].append(decode_step_ms(engines[name]))
    w, r = statistics.median(steps["windows"]), statistics.median(steps["rings"])
    print(f"decode step, 4 rows: kept windows {w:.2f} ms, rings alone {r:.2f} ms, ratio {w / r:.3f}")
    for e in engines.values():
        e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
