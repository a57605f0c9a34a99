"""An agent's tool loop with and without prefix reuse, side by side in one run.

    python bench/agent_loop.py [--turns 4] [--system-tokens 2000] [--max-tokens 24]

A system prompt of about 2,000 tokens with tool declarations (rendered by the model's chat template), a user
question, then per turn: the model answers (greedy, `max_tokens`), the loop appends a tool call and its result
as an agent framework does (the assistant turn re-rendered from the call, not the ids the model generated:
random weights cannot choose a tool) and asks again. Each prompt is the whole conversation so far. Printed per
turn: prompt tokens, time to first token with reuse on and off, their ratio (goal for turns 2-4: <= 0.25x), the
prompt tokens a kept slot gave back, and whether both engines generated the same tokens (they must). Both
settings of chunked prefill are run (the cpu default, 32, and 0: whole-prompt prefill buckets).

The model is the E4B-like tiny checkpoint with the real E4B sliding window (512; ring 576 with the slack), so
the rings behave as on the real model; context 4096.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_workers.config import EngineConfig  # noqa: E402
from neuron_workers.engine.params import SamplingParams  # noqa: E402
from neuron_workers.factory import build_engine  # noqa: E402

CTX = 4096


def checkpoint() -> Path:
    from neuron_workers.testing.tiny import TINY, write_checkpoint

    path = Path(tempfile.gettempdir()) / "gemma4-bench-e4b-window512"
    if not (path / "model.safetensors").is_file():
        text = dict(TINY["gemma4-e4b-tiny"][1], sliding_window=512, max_position_embeddings=CTX)
        write_checkpoint(path, "gemma4", text)
    return path


def tools(n: int) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool number {i}: looks things up in catalogue {i} and returns the "
                                             "matching records with their identifiers, owners and dates.",
        "parameters": {"type": "object", "required": ["query"], "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "limit": {"type": "integer", "description": "at most this many records"},
            "since": {"type": "string", "description": "an ISO date; older records are left out"}}}}}
        for i in range(n)]


def conversation(engine, system_tokens: int) -> tuple[list[dict], list[dict]]:
    """A system prompt and tools of about `system_tokens` tokens, and the user's question."""
    rule = "Answer precisely, cite the records you used, and call a tool whenever a fact is not in the context. "
    n_tools, lines = 4, 1
    while True:
        msgs = [{"role": "system", "content": rule * lines}, {"role": "user", "content": "Who owns record 7?"}]
        n = len(engine.encode_chat(msgs, tools=tools(n_tools)))
        if n >= system_tokens:
            return msgs, tools(n_tools)
        n_tools, lines = n_tools + 1, lines + 2


def turn(engine, ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    seq = engine.new_sequence(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    t0, ttft = time.perf_counter(), None
    for _ in engine.run_all([seq]):
        ttft = ttft or time.perf_counter() - t0
    return seq.output_ids, ttft


def loop(engine, msgs, tool_list, turns: int, max_tokens: int) -> list[tuple[int, float, int, list[int]]]:
    msgs = list(msgs)
    out = []
    for i in range(turns):
        ids = engine.encode_chat(msgs, tools=tool_list)
        hits = engine.prefix.hit_tokens if engine.prefix else 0
        tokens, ttft = turn(engine, ids, max_tokens)
        out.append((len(ids), ttft, (engine.prefix.hit_tokens if engine.prefix else 0) - hits, tokens))
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": f"tool_{i % len(tool_list)}", "arguments": json.dumps({"query": f"record {i}"})}}
        msgs += [{"role": "assistant", "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps({"owner": f"team {i}"})}]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2, help="loops per setting; the median TTFT is printed")
    args = ap.parse_args(argv)
    path = checkpoint()
    for chunk in (None, 0):
        runs = {}
        for cache in (False, True):
            eng = build_engine(EngineConfig(model=str(path), max_context=CTX, max_batch=2, prefill_chunk=chunk,
                                            prefix_cache=cache))
            msgs, tool_list = conversation(eng, args.system_tokens)
            turn(eng, eng.encode_chat(msgs, tools=tool_list)[:200], 2)  # warm-up (graphs, allocator)
            loops = []
            for _ in range(args.repeats):
                for slot in list(eng.prefix.kept) if eng.prefix else []:  # every loop starts cold
                    eng.prefix.drop(slot)
                loops.append(loop(eng, msgs, tool_list, args.turns, args.max_tokens))
            runs[cache] = loops
            label = eng.prefill_chunk or "off"
            eng.close()
        print(f"prefill_chunk {label}: turn, prompt tokens, TTFT without reuse, with reuse, ratio, tokens reused, "
              "same tokens")
        saved = 0
        for t in range(args.turns):
            off = statistics.median(r[t][1] for r in runs[False])
            on = statistics.median(r[t][1] for r in runs[True])
            same = all(a[t][3] == b[t][3] for a in runs[False] for b in runs[True])
            n, hit = runs[True][0][t][0], runs[True][0][t][2]
            saved += hit
            print(f"  turn {t + 1}: {n:5d} tokens  {off * 1e3:8.1f} ms  {on * 1e3:8.1f} ms  {on / off:5.2f}x  "
                  f"{hit:5d} reused  {'same' if same else 'DIFFERENT'}")
        print(f"  prefill tokens saved per loop: {saved} of {sum(r[0] for r in runs[True][0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
