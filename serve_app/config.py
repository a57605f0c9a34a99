"""Boundary configuration of the Ray Serve app, mirrored 1:1 by the `args` of configs/*.yaml. Imports no torch.

`AppArgs` is what `serve run configs/<x>.yaml` hands the builder; each `ModelSpec` becomes one
deployment. Relative paths are resolved against `base_dir` (default: the directory `serve run` was
started in) when the app is built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from neuron_workers.config import DEFAULT_MAX_BATCH, ENGINE_FIELDS, EngineConfig
from neuron_workers.errors import UserError

CORES_PER_TP = 1  # a rank runs on one NeuronCore
API_KEY_ENV = "GEMMA4_API_KEY"


def _engine_fields() -> dict:
    """The engine settings as pydantic fields, straight from `EngineConfig` (one schema, one set of checks)."""
    hints = typing.get_type_hints(EngineConfig)
    return {f.name: (hints[f.name], f.default) for f in dataclasses.fields(EngineConfig) if f.name in ENGINE_FIELDS}


EngineFields = create_model("EngineFields", **_engine_fields())


class ModelSpec(EngineFields):
    """One served model: its engine settings (the fields of `neuron_workers.config.EngineConfig`, checked
    there) plus how Serve runs it."""

    name: str = Field(description="Model name clients send as `model`")
    path: str = Field(description="Hugging Face checkpoint directory (config, weights, tokenizer)")
    stream_interval_ms: float = Field(40.0, ge=0, description="A stream sends at most one message per interval, "
                                      "with every token generated since the last (0: as often as "
                                      "stream_messages_per_s allows)")
    stream_messages_per_s: float = Field(100.0, gt=0, description="Messages a replica's streams send per second "
                                         "together, at most: with many streams each one's interval grows past "
                                         "stream_interval_ms (a message costs CPU in the replica, router and proxy)")
    engine_cpus: list[int] | None = Field(
        None, min_length=1, description="Host CPUs the engine process (and the rank processes it starts) runs "
        "on; negative counts from the end of the CPUs the replica may use ([-1]: the last, wrapping where there "
        "are fewer). Pinned, the engine's steps are not moved between CPUs as Serve's work comes and goes (others "
        "may still run there). Every replica of the model on a node gets the same CPUs. Ignored, with a warning, "
        "where the OS has no CPU affinity. None: wherever the OS runs it")
    engine: str = Field("serve_app.replica.engines:build_worker_engine",
                        description="Import path of the engine factory: spec -> engine (default: the real one)")
    engine_options: dict = Field(default_factory=dict, description="Extra options for a custom engine factory")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    prefix_routing: bool = Field(True, description="With several replicas, send a request to the replica that "
                                 "served its longest prefix (serve_app/ops/prefix_router.py) unless that one is "
                                 "busier than the rest by more than prefix_routing_imbalance; else Serve's "
                                 "power-of-two choice")
    prefix_routing_imbalance: int = Field(4, ge=0, description="Queued requests a prefix match may cost beyond the "
                                          "least busy replica")
    target_ongoing_requests: float | None = Field(
        None, gt=0, description="Autoscaling target per replica (default: max_batch, a replica is busy when its "
        "batch slots are)")
    upscale_delay_s: float = Field(30.0, ge=0, description="Load above target this long adds a replica")
    downscale_delay_s: float = Field(600.0, ge=0, description="Load below target this long removes one (it "
                                     "drains: its requests finish first)")
    autoscaling_options: dict = Field(default_factory=dict, description="Further fields of Serve's "
                                      "autoscaling_config (look_back_period_s, metrics_interval_s, ...)")
    max_ongoing_requests: int | None = Field(None, ge=1, description="Requests a replica holds at once, running "
                                             "or waiting for a slot (default: 2 x max_batch)")
    max_queued_requests: int = Field(16, ge=-1, description="Waiting callers before 503; -1 = unbounded")
    media_hosts: list[str] = Field(default_factory=list, description="Hosts an http(s) image URL may name: the "
                                   "replica fetches from these only (no redirects). Empty: data: URLs only")
    media_fetch_timeout_s: float = Field(10.0, gt=0, description="Fetching one image URL takes at most this")

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_mapping(self.model_dump(), self.path)

    @property
    def ongoing_limit(self) -> int:
        return self.max_ongoing_requests or 2 * (self.max_batch or DEFAULT_MAX_BATCH)

    @property
    def autoscaling_target(self) -> float:
        return self.target_ongoing_requests or float(self.max_batch or DEFAULT_MAX_BATCH)

    @property
    def neuron_cores(self) -> int:
        return self.tp * CORES_PER_TP if self.backend == "neuron" else 0

    @model_validator(mode="after")
    def _check(self):
        try:
            self.engine_config()
        except UserError as e:
            raise ValueError(f"model {self.name!r}: {e}") from None
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"model {self.name!r}: min_replicas > max_replicas")
        return self


class AppArgs(BaseModel):
    models: list[ModelSpec] = Field(min_length=1)
    accelerator_resource: str = Field(
        "neuron_cores", description="Ray resource neuron replicas ask for; cpu replicas ask for none")
    tiny_dir: str | None = Field(None, description="If set, write the tiny checkpoints here when missing")
    base_dir: str | None = Field(None, description="Directory relative paths are resolved against")
    router_max_ongoing_requests: int = 256
    graceful_shutdown_wait_loop_s: float = 2.0
    graceful_shutdown_timeout_s: float = Field(
        30.0, ge=0, description="On shutdown, how long a replica lets in-flight requests finish before it ends them")
    api_keys: list[str] = Field(default_factory=list, description=f"Keys every /v1 request must present as "
                                f"`Authorization: Bearer <key>`; ${API_KEY_ENV} adds one (prefer it: YAML "
                                f"args are visible on the Ray dashboard)")
    require_api_key: bool = Field(False, description=f"Refuse to start without a key (api_keys or ${API_KEY_ENV}): "
                                  f"for configs that listen on a public interface")
    max_request_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Largest request body; larger is a 413 "
                                   "(images and audio travel in it as base64)")
    instance: str | None = Field(None, description="The inf2 instance this config is sized for "
                                 "(`python -m compile plan --config` checks every model on it)")
    max_header_bytes: int = Field(32 * 1024, ge=1024, description="Largest request head (all headers); larger "
                                  "is a 431")
    body_timeout_s: float = Field(15.0, gt=0, description="A request body must arrive within this; else 408")
    drain_abort_grace_s: float = Field(2.0, ge=0, description="On shutdown, after graceful_shutdown_timeout_s, "
                                       "how long the requests still running get to send their error and close")

    @field_validator("models", mode="before")
    @classmethod
    def _json_from_cli(cls, v):  # `serve run serve_app.app:build_app models='[...]'` passes a string
        return json.loads(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _unique(self):
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        return self

    def key_digests(self) -> list[str]:
        """SHA-256 digests of the configured keys and of ${GEMMA4_API_KEY} (read where the app is built)."""
        from serve_app.ops.gate import key_digest

        keys = list(self.api_keys) + ([os.environ[API_KEY_ENV]] if os.environ.get(API_KEY_ENV) else [])
        return [key_digest(k) for k in keys]

    def resolved(self) -> "AppArgs":
        """Paths made absolute against base_dir (or the current directory)."""
        base = Path(self.base_dir or os.getcwd())
        fix = lambda p: None if p is None else str(p if Path(p).is_absolute() else base / p)  # noqa: E731
        models = [m.model_copy(update={"path": fix(m.path), "artifacts": fix(m.artifacts),
                                       "draft_model": fix(m.draft_model)}) for m in self.models]
        return self.model_copy(update={"models": models, "tiny_dir": fix(self.tiny_dir), "base_dir": str(base)})
