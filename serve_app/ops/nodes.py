"""Where a replica runs, for its own error messages: a replica that cannot start says which node it was on.

Artifacts (and checkpoints) must be present on every node that runs a replica, at the path the config
names: a shared filesystem mounted at the same path everywhere (EFS / FSx for Lustre on EKS), or a copy
made on each node before Ray starts there (see docs/operations.md, "Artifacts on every node"). At replica start the
engine reads the artifacts' manifest and refuses a mismatch naming the field
(`neuron_workers.artifacts.manifest.Manifest.check`); `build_engine_here` adds the node to that message,
so Serve's DEPLOY_FAILED status (and `/health`) says which machine has the wrong or missing copy.
"""

from __future__ import annotations

import socket

from neuron_workers.errors import UserError


def node_label() -> str:
    """`hostname (ip, node <id>)` of the process's Ray node; just the host name outside Ray."""
    host = socket.gethostname()
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id() or "?"
            return f"{host} ({ray.util.get_node_ip_address()}, node {node_id[:12]})"
    except Exception:
        pass
    return host


def build_engine_here(spec, factory):
    """`factory(spec)`, with a UserError (missing or mismatched artifacts, a bad checkpoint) re-raised
    naming the model and the node."""
    try:
        return factory(spec)
    except UserError as e:
        raise UserError(f"model {spec.name!r} cannot start on node {node_label()}: {e}", e.code, e.param) from None
