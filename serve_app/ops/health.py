"""Readiness that tells busy from down, answered from cached state within milliseconds at any load.

A probe never calls a replica (a replica's calls queue behind generation: under load that is a
BackPressureError, i.e. "not ready" exactly when the node is busiest). Instead the router polls
Serve's controller for its application's replicas, once a second (4 times while a model is not ready),
on a worker thread, and answers from that: a model is ready while at least one replica is RUNNING
(Serve marks a replica RUNNING once its constructor, which loads the engine, has returned, and replaces
one whose `check_health` fails), however busy it is. The first probe before any poll waits for one
poll (at most 1 s; during start-up that is a quick 503 "loading"). While draining the whole router
reads "draining" (503), so a load balancer stops sending new work. `/health/live` is 200 as long as
the router's process answers.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("ray.serve")
POLL_S = 1.0
POLL_STARTING_S = 0.25  # faster while some model is not ready yet: readiness shows soon after loading
FETCH_TIMEOUT_S = 10.0
FIRST_POLL_TIMEOUT_S = 1.0


def app_name() -> str | None:
    """The Serve application this replica belongs to (None outside a replica)."""
    from ray.serve.context import _get_internal_replica_context

    ctx = _get_internal_replica_context()
    return ctx.app_name if ctx else None


def _serve_details() -> dict:
    from ray.serve.context import _get_global_client

    return _get_global_client().get_serve_details()


def model_states(app: dict | None, deployments: dict[str, str]) -> tuple[dict, dict]:
    """(model -> "ready" | "loading" | "not ready (...)", model -> replicas) from the controller's
    details of one application (`get_serve_details()["applications"][app]`)."""
    deps = (app or {}).get("deployments", {})
    states, replicas = {}, {}
    for model, dep_name in deployments.items():
        d = deps.get(dep_name)
        if d is None:
            states[model], replicas[model] = "loading", {"running": []}
            continue
        running = [f"{(r.get('node_id') or '?')[:12]}@{r.get('node_ip')}" for r in d.get("replicas", [])
                   if r.get("state") == "RUNNING"]
        other: dict[str, int] = {}
        for r in d.get("replicas", []):
            if r.get("state") != "RUNNING":
                other[r.get("state")] = other.get(r.get("state"), 0) + 1
        replicas[model] = {"running": running, **({"other": other} if other else {})}
        if running:
            states[model] = "ready"
        elif d.get("status") in ("DEPLOY_FAILED", "UNHEALTHY"):
            states[model] = f"not ready ({d.get('status')}: {(d.get('message') or '')[:200]})"
        else:
            states[model] = "loading"
    return states, replicas


class Health:
    def __init__(self, app_name: str | None, deployments: dict[str, str], handles: dict, contexts: dict):
        self.app_name, self.deployments, self.handles, self.contexts = app_name, deployments, handles, contexts
        self.states = {m: "loading" for m in deployments}
        self.replicas: dict = {m: {"running": []} for m in deployments}
        self.polled_at: float | None = None
        self._task: asyncio.Task | None = None
        self._fetching: set[str] = set()
        self._warned = False

    def start(self) -> None:
        """Start polling (from the router's constructor, which Serve runs on the replica's event loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop here: the first probe starts it
            return
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._loop())

    async def answer(self, draining: bool) -> tuple[int, dict]:
        """`report`, after one poll of its own when none has completed yet (the first probe after a start)."""
        self.start()
        if self.polled_at is None:
            try:
                self.poll_once(await asyncio.wait_for(asyncio.to_thread(_serve_details), FIRST_POLL_TIMEOUT_S))
            except Exception:
                pass
        return self.report(draining)

    async def _loop(self) -> None:
        while True:
            try:
                self.poll_once(await asyncio.to_thread(_serve_details))
            except Exception as e:  # the controller restarting: keep the last known state
                if not self._warned:
                    log.warning("health: cannot read Serve's state (%s); keeping the last known", e)
                    self._warned = True
            await asyncio.sleep(POLL_S if all(v == "ready" for v in self.states.values()) else POLL_STARTING_S)

    def poll_once(self, details: dict) -> None:
        app = (details.get("applications") or {}).get(self.app_name)
        self.states, self.replicas = model_states(app, self.deployments)
        self.polled_at, self._warned = time.monotonic(), False
        for m, s in self.states.items():  # learn a model's context from its engine once it is up
            if s == "ready" and self.contexts.get(m) is None and m not in self._fetching and m in self.handles:
                self._fetching.add(m)
                asyncio.get_running_loop().create_task(self._fetch_context(m))

    async def _fetch_context(self, model: str) -> None:
        try:
            info = await asyncio.wait_for(self.handles[model].ready.remote(), FETCH_TIMEOUT_S)
            self.contexts[model] = info["max_context"]
        except Exception:
            pass
        finally:
            self._fetching.discard(model)

    def report(self, draining: bool) -> tuple[int, dict]:
        """(status code, body) of a readiness probe."""
        ready = all(s == "ready" for s in self.states.values())
        status = "draining" if draining else "ok" if ready else "loading"
        body = {"status": status, "models": dict(self.states), "replicas": self.replicas,
                "polled_s_ago": None if self.polled_at is None else round(time.monotonic() - self.polled_at, 2)}
        return (200 if ready and not draining else 503), body
