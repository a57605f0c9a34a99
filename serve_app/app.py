"""The application builder `serve run` calls (import path `serve_app.app:build_app`, args = AppArgs).

One ModelServer deployment per configured model (named `Model_<name>`), each replica asking Ray for
`neuron_cores: tp` on the neuron backend and for nothing on cpu, routed by prefix (`ops/prefix_router.py`)
unless `prefix_routing` is off, plus the Router ingress.
"""

from ray import serve  # no `from __future__ import annotations`: Serve reads build_app's annotation
from ray.serve.config import RequestRouterConfig

from serve_app.config import API_KEY_ENV, AppArgs, ModelSpec
from serve_app.ops import ray_env
from serve_app.ops.autoscale import autoscaling_config
from serve_app.ops.prefix_router import PrefixAffinityRouter
from serve_app.replica.model_server import ModelServer
from serve_app.router import Router

ModelDeployment = serve.deployment(ModelServer)


def deployment_options(m: ModelSpec, args: AppArgs) -> dict:
    res = {args.accelerator_resource: m.neuron_cores} if m.neuron_cores and args.accelerator_resource else {}
    opts = dict(name=f"Model_{m.name}", ray_actor_options={"num_cpus": 0, "resources": res,
                                                             "runtime_env": {"env_vars": dict(ray_env.REPLICA)}},
                max_ongoing_requests=m.ongoing_limit, max_queued_requests=m.max_queued_requests,
                graceful_shutdown_wait_loop_s=args.graceful_shutdown_wait_loop_s,
                graceful_shutdown_timeout_s=args.graceful_shutdown_timeout_s)
    if m.prefix_routing:
        opts["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"imbalance": m.prefix_routing_imbalance, "model": m.name})
    if m.min_replicas == m.max_replicas:
        opts["num_replicas"] = m.max_replicas
    else:
        opts["autoscaling_config"] = autoscaling_config(m)
    return opts


def check_accelerators(args: AppArgs) -> None:
    """Refuse, with the numbers, a config whose replicas could never be scheduled (Ray would leave them
    pending forever without an error)."""
    import ray

    need = sum(m.neuron_cores * max(m.min_replicas, 1) for m in args.models)
    if not need or not args.accelerator_resource or not ray.is_initialized():
        return
    have = int(ray.cluster_resources().get(args.accelerator_resource, 0))
    if have < need:
        wants = ", ".join(f"{m.name}: {m.neuron_cores}x{max(m.min_replicas, 1)}" for m in args.models if m.neuron_cores)
        raise ValueError(f"these models need {need} `{args.accelerator_resource}` ({wants}) but this Ray "
                         f"cluster has {have}: run on an inf2 instance (Ray detects NeuronCores with neuron-ls) "
                         f"or serve the CPU config, configs/local.yaml")


def build_app(args: AppArgs) -> serve.Application:
    args = (args if isinstance(args, AppArgs) else AppArgs(**args)).resolved()
    if args.tiny_dir:
        from neuron_workers.testing.tiny import ensure_tiny

        ensure_tiny(args.tiny_dir)
    check_accelerators(args)
    digests = args.key_digests()
    if args.require_api_key and not digests:
        raise ValueError(f"this config requires an API key: set {API_KEY_ENV}=<key> (or `api_keys` in its args)")
    handles = {m.name: ModelDeployment.options(**deployment_options(m, args)).bind(m.model_dump())
               for m in args.models}
    contexts = {m.name: m.max_context for m in args.models}
    return Router.options(max_ongoing_requests=router_ongoing_limit(args),
                          ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": dict(ray_env.REPLICA)}}).bind(
        handles, contexts, digests, args.max_request_bytes, ops_settings(args))


PROBE_HEADROOM = 64  # requests beyond what the models hold: health probes, /v1/models, 503s on their way out


def router_ongoing_limit(args: AppArgs) -> int:
    """`router_max_ongoing_requests`, raised to what every model can hold (running, waiting and queued) plus
    headroom: a router that is full queues its own /health probes in the ingress, behind generation."""
    if any(m.max_queued_requests < 0 for m in args.models):
        return args.router_max_ongoing_requests
    hold = sum(m.max_replicas * m.ongoing_limit + m.max_queued_requests for m in args.models)
    return max(args.router_max_ongoing_requests, hold + PROBE_HEADROOM)


def ops_settings(args: AppArgs) -> dict:
    """What the router's gate, drain and health need (plain values: they travel to the router's process)."""
    return {"max_header_bytes": args.max_header_bytes, "body_timeout_s": args.body_timeout_s,
            "drain_timeout_s": args.graceful_shutdown_timeout_s, "drain_abort_grace_s": args.drain_abort_grace_s}
