"""Per-model serving metrics, exported by Ray's metrics agent in Prometheus format (names get a `ray_`
prefix, counters a `_total` suffix; every series is tagged with application, deployment, replica and model).
Names follow vLLM's: time to first token, inter-token latency, queue time, tokens, finished requests,
running / waiting sequences, the batch occupancy of each decode step, the prefix cache's query and hit
tokens (and of those, the ones a restored sliding window served), and speculative decoding's draft and accepted
tokens. The router's prefix-aware routing counts the requests it sent by a match (`ops/prefix_router.py`).

`prometheus_text` is what the router's `GET /metrics` serves: every alive node's metrics agent, scraped in
threads, kept to the serving series unless all are asked for (`serving_only`: an idle cluster's agents export
about 1 MB, 3,000 lines, mostly Ray's own series and Serve's per-replica histograms)."""

from __future__ import annotations

import asyncio
import time

from ray.serve import metrics

MS_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000]
OCCUPANCY_BUCKETS = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
GAUGE_PERIOD_S = 0.25  # gauges are set at most this often from the engine reader thread


class ServerMetrics:
    def __init__(self, model: str):
        self.tags = {"model": model}
        tag = ("model",)
        self.ttft = metrics.Histogram("gemma4_time_to_first_token_ms", "Request arrival at the replica to its "
                                      "first token (when the engine made it)", MS_BUCKETS, tag)
        self.itl = metrics.Histogram("gemma4_inter_token_latency_ms", "Time between tokens (as the engine made them)",
                                     MS_BUCKETS, tag)
        self.queue = metrics.Histogram("gemma4_request_queue_time_ms", "Waiting for the replica's engine",
                                       MS_BUCKETS, tag)
        self.prompt_tokens = metrics.Counter("gemma4_prompt_tokens", "Prompt tokens processed", tag)
        self.generation_tokens = metrics.Counter("gemma4_generation_tokens", "Tokens generated", tag)
        self.finished = metrics.Counter("gemma4_request_finished", "Requests by finish reason",
                                        ("model", "finished_reason"))
        self.running = metrics.Gauge("gemma4_num_requests_running", "Sequences holding a batch slot", tag)
        self.waiting = metrics.Gauge("gemma4_num_requests_waiting", "Sequences waiting for a slot", tag)
        self.occupancy = metrics.Histogram("gemma4_batch_occupancy", "Share of the batch slots each decode step "
                                           "used", OCCUPANCY_BUCKETS, tag)
        self.prefix_query = metrics.Counter("gemma4_prefix_cache_query_tokens", "Prompt tokens admitted while "
                                            "prefix reuse is on", tag)
        self.prefix_hit = metrics.Counter("gemma4_prefix_cache_hit_tokens", "Prompt tokens a slot's kept KV held, "
                                          "not prefilled again", tag)
        self.prefix_window_hit = metrics.Counter("gemma4_prefix_cache_window_hit_tokens", "Of the prefix hit "
                                                 "tokens, those served through a restored sliding window", tag)
        self.spec_drafts = metrics.Counter("gemma4_spec_decode_num_draft_tokens", "Draft tokens verified", tag)
        self.spec_accepted = metrics.Counter("gemma4_spec_decode_num_accepted_tokens", "Draft tokens accepted", tag)
        for m in (self.ttft, self.itl, self.queue, self.prompt_tokens, self.generation_tokens, self.running,
                  self.waiting, self.occupancy, self.prefix_query, self.prefix_hit, self.prefix_window_hit,
                  self.spec_drafts, self.spec_accepted):
            m.set_default_tags(dict(self.tags))  # Ray adds its own tags to the dict it is given
        self._gauges_at = 0.0
        self._totals = (0, 0, 0, 0, 0)  # the engine's totals already counted

    def request(self) -> "RequestTimer":
        return RequestTimer(self)

    def step(self, stats, decoded: tuple[int, ...]) -> None:
        """Called by the replica's engine reader thread for each message of the engine process: its latest
        counts (an `engine.loop.StepStats`) and the decode rows of every step since the last message."""
        for rows in decoded:
            if rows:
                self.occupancy.observe(rows / stats.max_batch)
        self._count_totals(stats)
        now = time.perf_counter()
        if now - self._gauges_at >= GAUGE_PERIOD_S or not (stats.running or stats.waiting):
            self._gauges_at = now
            self.running.set(stats.running)
            self.waiting.set(stats.waiting)

    def _count_totals(self, stats) -> None:
        """The engine's running totals (prefix cache, speculative decoding), counted by what they grew since
        the last message (a restarted engine process starts again at 0)."""
        now = (stats.prefix_query_tokens, stats.prefix_hit_tokens, stats.spec_draft_tokens,
               stats.spec_accepted_tokens, stats.prefix_window_hit_tokens)
        seen = self._totals if all(a >= b for a, b in zip(now, self._totals)) else (0,) * len(now)
        counters = (self.prefix_query, self.prefix_hit, self.spec_drafts, self.spec_accepted, self.prefix_window_hit)
        for counter, a, b in zip(counters, now, seen):
            if a > b:
                counter.inc(a - b)
        self._totals = now

    def finish(self, reason: str) -> None:
        self.finished.inc(1, {"model": self.tags["model"], "finished_reason": reason})


class RequestTimer:
    """Times one request from its arrival at the replica (perf_counter clock, as the engine's)."""

    def __init__(self, m: ServerMetrics):
        self.m, self.arrived, self.last = m, time.perf_counter(), None

    def prompt(self, tokens: int) -> None:
        self.m.prompt_tokens.inc(tokens)

    def tokens(self, ats: list[float], admitted_at: float | None) -> None:
        """Tokens emitted by the engine at `ats` (one delivery); the first of a request also records the time
        spent waiting. One counter update per delivery: each Ray metric call holds the GIL the engine
        thread needs."""
        for at in ats:
            if self.last is None:
                self.m.ttft.observe((at - self.arrived) * 1e3)
                self.m.queue.observe(((admitted_at or at) - self.arrived) * 1e3)
            else:
                self.m.itl.observe((at - self.last) * 1e3)
            self.last = at
        if ats:
            self.m.generation_tokens.inc(len(ats))


def _scrape(host: str, port: int) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError as e:
        return f"# metrics agent {host}:{port} unreachable: {e}\n"


def serving_only(text: str) -> str:
    """The serving series of `text`: every `ray_gemma4_*` family, Serve's `ray_serve_*` counters and gauges (its
    histograms, per replica and route, are most of the bytes), and the scrape reports."""
    lines, hist = text.splitlines(), set()
    for line in lines:
        if line.startswith("# TYPE ") and line.endswith(" histogram"):
            hist.add(line.split(" ")[2])

    def family(name: str) -> str:
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in hist:
                return name[: -len(suffix)]
        return name

    def keep(line: str) -> bool:
        if line.startswith("# metrics agent"):
            return True
        name = line.split(" ", 3)[2] if line.startswith(("# HELP ", "# TYPE ")) else line.split("{")[0].split(" ")[0]
        name = family(name)
        return name.startswith("ray_gemma4_") or name.startswith("ray_serve_") and name not in hist

    return "".join(line + "\n" for line in lines if keep(line))


async def prometheus_text(everything: bool = False) -> str:
    import ray

    nodes = [(n["NodeManagerAddress"], n["MetricsExportPort"]) for n in ray.nodes() if n.get("Alive")]
    texts = await asyncio.gather(*(asyncio.to_thread(_scrape, h, p) for h, p in nodes))
    return "".join(texts) if everything else "".join(map(serving_only, texts))
