"""The Grafana dashboard (configs/grafana/gemma4_dashboard.json) against a running server: the JSON is an
importable Grafana dashboard model, and every PromQL expression in it (panel targets and template variables)
names only series that the server's `GET /metrics` exports, with labels those series carry. The app runs on the
session's local cluster (`serve_url`): one tiny model whose greedy output loops, with prompt-lookup speculation
(so drafts are accepted), a repeated prompt (a prefix-cache hit) and a stream kept running while `/metrics` is
polled (the gauges), so that every series the dashboard reads exists."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from conftest import deploy

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana" / "gemma4_dashboard.json"
SERIES = re.compile(r"\b(ray_gemma4_[a-z0-9_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(.*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)")
OPTIONAL_LABELS = {"ray_io_cluster"}  # set per cluster by KubeRay's PodMonitor, absent on a plain cluster
# the series every panel group reads: one request of each kind below makes them exist
NEEDED = ("ray_gemma4_spec_decode_num_accepted_tokens_total", "ray_gemma4_prefix_cache_hit_tokens_total",
          "ray_gemma4_prefix_cache_window_hit_tokens_total",
          "ray_gemma4_time_to_first_token_ms_bucket", "ray_gemma4_request_finished_total",
          "ray_gemma4_num_requests_running", "ray_gemma4_batch_occupancy_bucket")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(d: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets (rows included) and query variables."""
    exprs = []
    for p in d["panels"]:
        for sub in [p, *p.get("panels", [])]:
            exprs += [t["expr"] for t in sub.get("targets", [])]
    for v in d["templating"]["list"]:
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            exprs.append(q)
    return exprs


def exported(text: str) -> dict[str, set[str]]:
    """Series name -> the label names it carries, from Prometheus text."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
        if m:
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
            out.setdefault(m.group(1), set()).update(labels)
    return out


def problems(d: dict, series: dict[str, set[str]]) -> list[str]:
    """What in the dashboard's queries the exported series do not hold: unknown names, unknown labels."""
    bad = []
    for expr in expressions(d):
        names = SERIES.findall(expr)
        if not names:
            bad.append(f"no ray_gemma4_ series in {expr!r}")
        for name, selector in names:
            if name not in series:
                bad.append(f"{name} is not exported")
                continue
            for label in MATCHER.findall(selector or ""):
                if label not in series[name] | OPTIONAL_LABELS:
                    bad.append(f"{name} has no label {label!r}")
        known = [n for n, _ in names if n in series]
        for label in LABEL_VALUES.findall(expr) if known else ():
            if label not in series[known[0]] | OPTIONAL_LABELS:
                bad.append(f"{known[0]} has no label {label!r} for {expr!r}")
        for by in BY.findall(expr) if known else ():
            for label in (x.strip() for x in by.split(",") if x.strip()):
                if label != "le" and all(label not in series[n] for n in known):
                    bad.append(f"no series of {expr!r} has the label {label!r} it is grouped by")
    return bad


def test_dashboard_is_an_importable_grafana_model():
    d = dashboard()
    assert d["title"] and re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", d["uid"]) and isinstance(d["schemaVersion"], int)
    names = [v["name"] for v in d["templating"]["list"]]
    assert "datasource" in names and next(v for v in d["templating"]["list"]
                                           if v["name"] == "datasource")["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in d["panels"] if p["type"] != "row"]
    assert len(graphs) >= 9
    for p in graphs:
        assert p["datasource"] == "${datasource}" and p["title"] and p["targets"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"].strip() for t in p["targets"])
    # the asked-for views are there: percentiles over the histograms' buckets, the two rates, finish reasons
    exprs = " ".join(expressions(d))
    for hist in ("time_to_first_token_ms", "inter_token_latency_ms", "request_queue_time_ms"):
        assert f"histogram_quantile(0.99, sum by (le, model) (rate(ray_gemma4_{hist}_bucket" in exprs
    assert "prefix_cache_hit_tokens_total" in exprs and "spec_decode_num_accepted_tokens_total" in exprs
    assert "finished_reason" in exprs and "ray_gemma4_batch_occupancy" in exprs


def test_the_json_is_what_its_generator_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_dashboard", DASHBOARD.with_name("make_dashboard.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DASHBOARD.read_text() == module.text(), "run python configs/grafana/make_dashboard.py"


def test_the_check_sees_an_unknown_series_and_an_unknown_label():
    d = {"panels": [{"targets": [{"expr": 'sum by (model) (rate(ray_gemma4_nope_total{model=~"$Model"}[5m]))'},
                                 {"expr": 'ray_gemma4_num_requests_running{colour="red"}'}]}],
         "templating": {"list": []}}
    series = {"ray_gemma4_num_requests_running": {"model", "application"}}
    d["panels"][0]["targets"].append({"expr": 'sum by (replica_colour) (ray_gemma4_num_requests_running)'})
    d["templating"]["list"].append({"type": "query", "query": {"query": "label_values(ray_gemma4_num_requests_running"
                                                                         ", colour)"}})
    assert problems(d, series) == ["ray_gemma4_nope_total is not exported",
                                   "ray_gemma4_num_requests_running has no label 'colour'",
                                   "no series of 'sum by (replica_colour) (ray_gemma4_num_requests_running)' has the "
                                   "label 'replica_colour' it is grouped by",
                                   "ray_gemma4_num_requests_running has no label 'colour' for "
                                   "'label_values(ray_gemma4_num_requests_running, colour)'"]


def looping_checkpoint(src: Path, out: Path) -> Path:
    """The E4B-like tiny with every `o_proj` and `down_proj` zeroed (as bench/spec_decode.py): its next token
    depends on the current one only, so greedy output cycles and prompt-lookup drafts get accepted."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    weights = load_file(str(src / "model.safetensors"))
    weights = {k: v * 0 if k.endswith(("o_proj.weight", "down_proj.weight")) else v for k, v in weights.items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def spec_app(serve_url, tiny_dirs, tmp_path_factory):
    path = looping_checkpoint(tiny_dirs["gemma4-e4b-tiny"], tmp_path_factory.mktemp("dash") / "looping")
    models = [{"name": "loop", "path": str(path), "backend": "cpu", "max_context": 512, "max_batch": 2,
               "speculative_method": "ngram", "num_speculative_tokens": 3}]
    url = deploy({"models": models, "accelerator_resource": "", "graceful_shutdown_wait_loop_s": 0}, "dashboard",
                 serve_url)
    yield url
    from ray import serve

    serve.delete("dashboard")


def post(h: httpx.Client, url: str, body: dict) -> httpx.Response:
    """POST, again when the connection was cut before an answer (HAProxy reloads its config for a while after
    an app is deployed: a connection it held can close under a request)."""
    for attempt in range(3):
        try:
            return h.post(url, json=body)
        except (httpx.RemoteProtocolError, httpx.ConnectError):
            if attempt == 2:
                raise
            time.sleep(2)


def wait_healthy(h: httpx.Client, base: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if h.get(f"{base}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError(f"{base}/health not 200 within {timeout} s")


def keep_busy(url: str, stop) -> None:
    """Streams one long greedy completion after another until `stop` is set: the gauges are set while
    sequences run, so they are exported while this runs."""
    with httpx.Client(timeout=120) as h:
        while not stop.is_set():
            body = {"model": "loop", "prompt": "one two three", "max_tokens": 400, "temperature": 0, "stream": True}
            try:
                with h.stream("POST", f"{url}/completions", json=body) as r:
                    for _ in r.iter_lines():
                        if stop.is_set():
                            break
            except httpx.TransportError:
                time.sleep(1)


def test_every_dashboard_query_names_exported_series(spec_app):
    import threading

    metrics_url = spec_app.removesuffix("/v1") + "/metrics"
    loop = " ".join(["one two three four five six"] * 6)
    series: dict[str, set[str]] = {}
    stop = threading.Event()
    busy = threading.Thread(target=keep_busy, args=(spec_app, stop), daemon=True)
    with httpx.Client(timeout=120) as h:
        wait_healthy(h, spec_app.removesuffix("/v1"))
        for _ in range(2):  # the second reuses the first's prompt (a prefix cache hit); both draft from the loop
            body = {"model": "loop", "prompt": loop, "max_tokens": 48, "temperature": 0}
            r = post(h, f"{spec_app}/completions", body)
            assert r.status_code == 200, r.text
        r = post(h, f"{spec_app}/chat/completions", {"model": "loop", "max_tokens": 4, "stream": True,
                                                      "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and "[DONE]" in r.text
        busy.start()
        try:
            deadline = time.time() + 90
            while time.time() < deadline:  # Ray's agents export what the replicas recorded every few seconds
                for name, labels in exported(h.get(metrics_url).text).items():
                    series.setdefault(name, set()).update(labels)
                if all(name in series for name in NEEDED):
                    break
                time.sleep(2)
        finally:
            stop.set()
            busy.join(60)
    missing = [name for name in NEEDED if name not in series]
    assert not missing, f"not exported after the requests: {missing}; exported: {sorted(series)}"
    assert problems(dashboard(), series) == []
