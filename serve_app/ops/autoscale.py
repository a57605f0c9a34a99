"""Autoscaling sized to continuous batching: Serve's `autoscaling_config` for one model.

A replica decodes `max_batch` sequences at once, so it is "busy" when its slots are: the target of
ongoing requests per replica defaults to `max_batch` (Serve's own default, 2, would add a replica, and
its NeuronCores, long before the first one is full). Scaling down removes a replica gracefully: Serve
stops routing to it and its requests finish (up to `graceful_shutdown_timeout_s`) before it stops.
"""

from __future__ import annotations

from serve_app.config import ModelSpec


def autoscaling_config(m: ModelSpec) -> dict:
    """The `autoscaling_config` of a model whose min_replicas differs from max_replicas."""
    return {"min_replicas": m.min_replicas, "max_replicas": m.max_replicas,
            "target_ongoing_requests": m.autoscaling_target, "upscale_delay_s": m.upscale_delay_s,
            "downscale_delay_s": m.downscale_delay_s, **m.autoscaling_options}
