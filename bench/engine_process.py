"""What the process boundary alone costs: the same greedy requests on the replica's engine run in this
process and through `serve_app.replica.engine_process.EngineProcess` (the engine in a process of its own, as a
replica runs it; no Ray, no HTTP), two one at a time and 8 together, streamed and not, rounds interleaved.

    python bench/engine_process.py [--model gemma-4-e2b-tiny] [--tokens 48] [--requests 8] [--rounds 9]

Prints ms per round of each (median) and the ratio in-process / engine process, and for the engine
process the messages it sent per round and the CPU this process (the replica's side: the reader thread
that unpickles them and hands them on) spent per round; every answer must equal the in-process one.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_app import on_cpus  # noqa: E402  (bench/, beside this script)


def local_spec(model: str, tmp: str):
    """configs/local.yaml's spec of `model`, its tiny checkpoint written under tmp."""
    import yaml

    from neuron_workers.testing.tiny import ensure_tiny
    from serve_app.config import AppArgs

    args = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())["applications"][0]["args"]
    ensure_tiny(tmp)
    args.update(tiny_dir=tmp, base_dir=tmp)
    for m in args["models"]:
        m["path"] = str(Path(tmp) / Path(m["path"]).name)
    return next(m for m in AppArgs(**args).models if m.name == model)


def in_process(engine, texts, tokens) -> tuple[float, list[list[int]]]:
    from neuron_workers.engine.params import SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    t = time.perf_counter()
    seqs = [engine.new_sequence(engine.encode(x), params) for x in texts]
    out = {s.seq_id: [] for s in seqs}
    for ev in engine.run_all(seqs):
        out[ev.seq_id].append(ev.token_id)
    return time.perf_counter() - t, list(out.values())


def through_process(proc, texts, tokens, stream: bool) -> tuple[float, list[list[int]], float]:
    """(seconds, token ids per request, CPU seconds of this process)."""
    from serve_app.events import GenerateRequest

    q: queue.SimpleQueue = queue.SimpleQueue()
    t, cpu = time.perf_counter(), time.process_time()
    rids = [proc.submit(GenerateRequest(kind="completion", prompt=x, max_tokens=tokens, ignore_eos=True,
                                        stream=stream, sampling=(("temperature", 0.0),)),
                        lambda item, i=i: q.put((i, item))) for i, x in enumerate(texts)]
    out, left = [[] for _ in rids], len(rids)
    while left:
        i, item = q.get(timeout=300)
        if hasattr(item, "event"):
            out[i].append(item.event.token_id)
        left -= item.final
    return time.perf_counter() - t, out, time.process_time() - cpu


def count_messages(proc) -> list:
    """The engine process's step messages, counted as the reader receives them (one list entry each)."""
    seen, dispatch = [], proc._dispatch

    def counting(msg):
        if msg[0] == "step":
            seen.append(1)
        dispatch(msg)

    proc._dispatch = counting
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-4-e2b-tiny")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    from neuron_workers.factory import build_engine
    from serve_app.replica.engine_process import EngineProcess

    texts = [f"Request {i}: tell me a story about the sea number {i}" for i in range(args.requests)]
    with tempfile.TemporaryDirectory() as tmp:
        spec = local_spec(args.model, tmp)
        engine, proc = build_engine(spec.engine_config()), EngineProcess(spec)
        messages = count_messages(proc)
        try:
            times: dict[tuple[str, str], list[float]] = {}
            load: dict[tuple[str, str], list[tuple[int, float]]] = {}
            for _ in range(args.rounds + 1):  # the first round warms up
                for how, batch in (("one at a time", [[x] for x in texts[:2]]), ("together", [texts])):
                    with on_cpus(spec.engine_cpus):  # where the engine process runs
                        secs, want = zip(*(in_process(engine, b, args.tokens) for b in batch))
                    times.setdefault((how, "in-process"), []).append(sum(secs))
                    for stream in (True, False):
                        messages.clear()
                        got = [through_process(proc, b, args.tokens, stream) for b in batch]
                        assert [g[1] for g in got] == list(want), "an answer differs from the in-process one"
                        kind = "streamed" if stream else "non-streamed"
                        times.setdefault((how, kind), []).append(sum(g[0] for g in got))
                        load.setdefault((how, kind), []).append((len(messages), sum(g[2] for g in got)))
        finally:
            proc.close()
    print(f"{args.model} (max_batch {proc.max_batch}, {spec.backend}), greedy x {args.tokens} tokens, median of "
          f"{args.rounds} rounds; answers identical: yes")
    for how, n in (("one at a time", 2), ("together", args.requests)):
        base = statistics.median(times[(how, "in-process")][1:])
        line = f"{how:13s} ({n} requests) in-process {base * 1e3:7.1f} ms"
        for kind in ("streamed", "non-streamed"):
            t = statistics.median(times[(how, kind)][1:])
            msgs, cpu = (statistics.median(x) for x in zip(*load[(how, kind)][1:]))
            line += (f"\n    engine process {kind:12s} {t * 1e3:7.1f} ms ratio {base / t:.3f}; {msgs:4.0f} messages, "
                     f"replica side {cpu * 1e3:5.1f} ms CPU")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
