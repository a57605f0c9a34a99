"""Per-model serving metrics, exported by Ray's metrics agent in Prometheus format (names get a `ray_`
prefix, counters a `_total` suffix; every series is tagged with application, deployment, replica and model).
Names follow vLLM's: time to first token, inter-token latency, queue time, tokens, finished requests."""

from __future__ import annotations

import time

from ray.serve import metrics

MS_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000]


class ServerMetrics:
    def __init__(self, model: str):
        self.tags = {"model": model}
        tag = ("model",)
        self.ttft = metrics.Histogram("gemma4_time_to_first_token_ms", "Request arrival to first token",
                                      MS_BUCKETS, tag)
        self.itl = metrics.Histogram("gemma4_inter_token_latency_ms", "Time between tokens", MS_BUCKETS, tag)
        self.queue = metrics.Histogram("gemma4_request_queue_time_ms", "Waiting for the replica's engine",
                                       MS_BUCKETS, tag)
        self.prompt_tokens = metrics.Counter("gemma4_prompt_tokens", "Prompt tokens processed", tag)
        self.generation_tokens = metrics.Counter("gemma4_generation_tokens", "Tokens generated", tag)
        self.finished = metrics.Counter("gemma4_request_finished", "Requests by finish reason",
                                        ("model", "finished_reason"))
        for m in (self.ttft, self.itl, self.queue, self.prompt_tokens, self.generation_tokens):
            m.set_default_tags(dict(self.tags))  # Ray adds its own tags to the dict it is given

    def request(self, prompt_tokens: int) -> "RequestTimer":
        self.prompt_tokens.inc(prompt_tokens)
        return RequestTimer(self)

    def finish(self, reason: str) -> None:
        self.finished.inc(1, {"model": self.tags["model"], "finished_reason": reason})


class RequestTimer:
    def __init__(self, m: ServerMetrics):
        self.m, self.arrived, self.last = m, time.perf_counter(), None

    def started(self) -> None:
        self.m.queue.observe((time.perf_counter() - self.arrived) * 1e3)

    def token(self) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.m.ttft.observe((now - self.arrived) * 1e3)
        else:
            self.m.itl.observe((now - self.last) * 1e3)
        self.last = now
        self.m.generation_tokens.inc()
