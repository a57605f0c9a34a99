"""Writes configs/grafana/gemma4_dashboard.json, the Grafana dashboard of the `ray_gemma4_*` series
(serve_app/ops/metrics.py), in the shape of Ray 2.60's own dashboards (ray/dashboard/modules/metrics/dashboards:
their graph panel template, their `datasource` and `Cluster` variables, their base JSON's schema version).

    python configs/grafana/make_dashboard.py          # rewrite the JSON after changing the panels below

tests/serve/test_dashboard.py checks that the JSON is what this writes and that its queries name exported series."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import ray
from ray.dashboard.modules.metrics.dashboards.common import PanelTemplate

OUT = Path(__file__).resolve().parent / "gemma4_dashboard.json"

F = 'application=~"$Application", model=~"$Model", ray_io_cluster=~"$Cluster"'
R = "[$interval]"


def rate(metric, by="model"):
    return f"sum by ({by}) (rate({metric}{{{F}}}{R}))"


def quantiles(hist):
    return [(f"histogram_quantile({q}, sum by (le, model) (rate({hist}_bucket{{{F}}}{R})))",
             f"p{int(q * 100)} {{{{model}}}}") for q in (0.5, 0.9, 0.99)]


def ratio(num, den):
    return f"{rate(num)}\n/\n({rate(den)} > 0)"


ROWS = [
    ("Traffic", [
        ("Requests per model", "Requests that finished per second, per model (every request that reached a replica "
         "is counted once, errors and clients that left included).", "reqps",
         [(rate("ray_gemma4_request_finished_total"), "{{model}}")]),
        ("Tokens per model", "Prompt tokens processed and tokens generated per second, per model.", "short",
         [(rate("ray_gemma4_prompt_tokens_total"), "prompt {{model}}"),
          (rate("ray_gemma4_generation_tokens_total"), "generated {{model}}")]),
        ("Finish reasons", "Requests per second by finish reason (stop, length, abort, error), per model.", "reqps",
         [(rate("ray_gemma4_request_finished_total", "model, finished_reason"), "{{finished_reason}} {{model}}")]),
        ("Running and waiting sequences", "Sequences holding a batch slot (running) and waiting for one, per model "
         "(gauges, set at most every 0.25 s).", "short",
         [("sum by (model) (ray_gemma4_num_requests_running{" + F + "})", "running {{model}}"),
          ("sum by (model) (ray_gemma4_num_requests_waiting{" + F + "})", "waiting {{model}}")]),
    ]),
    ("Latency", [
        ("Time to first token", "From the request's arrival at the replica to its first token (when the engine made "
         "it): p50 / p90 / p99 over the interval, per model.", "ms", quantiles("ray_gemma4_time_to_first_token_ms")),
        ("Inter-token latency", "Time between a request's tokens as the engine made them: p50 / p90 / p99, per model.",
         "ms", quantiles("ray_gemma4_inter_token_latency_ms")),
        ("Queue time", "Time a request waited for the replica's engine (arrival to admission into a slot): "
         "p50 / p90 / p99, per model.", "ms", quantiles("ray_gemma4_request_queue_time_ms")),
    ]),
    ("Batching and reuse", [
        ("Batch occupancy", "Share of the batch slots each decode step used: the mean and the p50 over the interval, "
         "per model.", "percentunit",
         [(ratio("ray_gemma4_batch_occupancy_sum", "ray_gemma4_batch_occupancy_count"), "mean {{model}}"),
          (quantiles("ray_gemma4_batch_occupancy")[0][0], "p50 {{model}}")]),
        ("Prefix-cache hit rate", "Of the prompt tokens admitted while prefix reuse is on, the share a slot's kept KV "
         "held (not prefilled again), and the share a restored sliding window served, per model.", "percentunit",
         [(ratio("ray_gemma4_prefix_cache_hit_tokens_total", "ray_gemma4_prefix_cache_query_tokens_total"),
           "{{model}}"),
          (ratio("ray_gemma4_prefix_cache_window_hit_tokens_total", "ray_gemma4_prefix_cache_query_tokens_total"),
           "windows {{model}}")]),
        ("Speculative acceptance rate", "Of the draft tokens verified, the share accepted, per model (only models "
         "with speculative decoding on report drafts).", "percentunit",
         [(ratio("ray_gemma4_spec_decode_num_accepted_tokens_total", "ray_gemma4_spec_decode_num_draft_tokens_total"),
           "{{model}}")]),
    ]),
]


def panel(pid, title, desc, unit, targets, x, y):
    p = copy.deepcopy(PanelTemplate.GRAPH.value)
    p.update(id=pid, title=title, description=desc, gridPos={"h": 8, "w": 12, "x": x, "y": y},
             targets=[{"exemplar": True, "expr": e, "interval": "", "legendFormat": leg, "refId": chr(65 + i)}
                      for i, (e, leg) in enumerate(targets)],
             seriesOverrides=[], stack=False, fill=1, nullPointMode="null")
    p["fieldConfig"]["defaults"]["unit"] = unit
    p["yaxes"][0]["format"] = unit
    return p


def variable(name, label, metric_filter, label_name, multi):
    q = f"label_values(ray_gemma4_request_finished_total{{{metric_filter}}}, {label_name})"
    return {"allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "datasource": "${datasource}", "definition": q, "hide": 0, "includeAll": True, "label": label,
            "multi": multi, "name": name, "options": [], "query": {"query": q, "refId": "StandardVariableQuery"},
            "refresh": 1, "regex": "", "skipUrlSync": False, "sort": 1, "type": "query"}


def dashboard() -> dict:
    """The dashboard as Grafana's JSON model."""
    base = json.loads(Path(ray.__file__).parent.joinpath(
        "dashboard/modules/metrics/dashboards/serve_grafana_dashboard_base.json").read_text())
    panels, pid, y = [], 1, 0
    for row, items in ROWS:
        panels.append({"collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "id": pid, "panels": [],
                       "title": row, "type": "row"})
        pid, y = pid + 1, y + 1
        for i, item in enumerate(items):
            panels.append(panel(pid, *item, x=12 * (i % 2), y=y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(items) + 1) // 2)

    cluster = next(v for v in base["templating"]["list"] if v["name"] == "Cluster")
    cluster = copy.deepcopy(cluster)
    cluster_query = "label_values(ray_gemma4_request_finished_total, ray_io_cluster)"
    cluster["definition"] = cluster["query"]["query"] = cluster_query
    interval = {"current": {"selected": True, "text": "5m", "value": "5m"}, "hide": 0, "includeAll": False,
                "label": "Interval", "multi": False, "name": "interval", "type": "custom", "query": "1m,5m,10m,15m",
                "options": [{"selected": v == "5m", "text": v, "value": v} for v in ("1m", "5m", "10m", "15m")]}
    datasource = next(v for v in base["templating"]["list"] if v["name"] == "datasource")
    dash = {
        "annotations": base["annotations"],
        "description": "Gemma-4 on Inferentia2 (gemma4-inf2): the ray_gemma4_* series of serve_app/ops/metrics.py, "
        "per model. Generated in the shape of Ray's own Serve dashboards.",
        "editable": True, "gnetId": None, "graphTooltip": 1, "id": None, "links": [], "panels": panels,
        "refresh": "30s", "schemaVersion": base["schemaVersion"], "style": "dark", "tags": ["ray", "serve", "gemma4"],
        "templating": {"list": [datasource,
                                variable("Application", "Application", 'ray_io_cluster=~"$Cluster"', "application",
                                         True),
                                variable("Model", "Model", 'application=~"$Application", ray_io_cluster=~"$Cluster"',
                                         "model", True),
                                cluster, interval]},
        "time": {"from": "now-30m", "to": "now"}, "timepicker": {}, "timezone": "", "title": "Gemma-4 Serve Dashboard",
        "uid": "gemma4ServeDashboard", "version": 1,
    }
    return dash


def text() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(text())
    print(OUT)
