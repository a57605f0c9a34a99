"""`python -m serve_app.run CONFIG [serve run options]`: `serve run` that drains on SIGINT and SIGTERM.

Plain `serve run` deletes everything at once on Ctrl-C (Serve kills its HTTP proxies at the start of a
shutdown, so every open connection is cut) and does not handle SIGTERM at all. This runs the same
`serve run` command in this process with a handler for both signals: on the first one it asks every
running application's router to drain (`serve_app/ops/drain.py`: new requests get 503 with Retry-After,
requests in flight get up to `graceful_shutdown_timeout_s` to finish, the rest end with the stream
error event or a 503), then lets `serve run` shut Serve down. A second signal stops at once.

From a script: `python -m serve_app.run configs/local.yaml & PID=$!; ...; kill -TERM $PID; wait $PID`
(SIGTERM: a backgrounded job ignores SIGINT). `python -m serve_app.run --drain [--address ADDR]`
drains the applications of a running cluster and exits (e.g. a Kubernetes preStop hook).
"""

from __future__ import annotations

import signal
import sys
import threading

DRAIN_MARGIN_S = 30.0  # on top of the routers' own bound (timeout + abort grace)


def drain_all(log=print) -> None:
    """Drain the router of every running application of the connected cluster, all at once."""
    from ray import serve

    refs = {}
    for name in serve.status().applications:
        try:
            refs[name] = serve.get_app_handle(name).drain.remote()
        except Exception as e:  # not one of ours, or gone
            log(f"drain: application {name!r} cannot drain: {e}")
    for name, ref in refs.items():
        try:
            log(f"drain: application {name!r}: {ref.result(timeout_s=600)}")
        except Exception as e:
            log(f"drain: application {name!r}: {type(e).__name__}: {e}")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def install_handlers() -> None:
    state = {"phase": "serving"}

    def drain_then_stop():
        try:
            drain_all(_say)
        finally:
            state["phase"] = "drained"
            # a real signal to the main thread (it wakes from `serve run`'s sleep), which then raises
            # KeyboardInterrupt: `serve run` shuts Serve down
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def on_signal(signum, frame):
        import ray

        if state["phase"] != "serving" or not ray.is_initialized():
            raise KeyboardInterrupt  # drained, a second signal, or nothing deployed yet: stop now
        state["phase"] = "draining"
        _say(f"got {signal.Signals(signum).name}: draining (a second signal stops at once)")
        threading.Thread(target=drain_then_stop, name="drain", daemon=True).start()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--drain"]:
        import ray

        address = argv[argv.index("--address") + 1] if "--address" in argv else "auto"
        ray.init(address=address, namespace="serve", log_to_driver=False)
        drain_all(_say)
        return
    from serve_app.ops.ray_env import apply_cluster_env

    apply_cluster_env()  # before Ray starts: a local cluster's processes inherit them
    import ray

    install_handlers()
    connect = ray.init

    def init_then_handle(*args, **kwargs):  # Ray's core worker installs its own SIGTERM handler in init
        out = connect(*args, **kwargs)
        install_handlers()
        return out

    ray.init = init_then_handle  # `serve run` calls ray.init through the module
    from ray.serve.scripts import cli

    cli.main(["run", *argv], prog_name="serve run")


if __name__ == "__main__":
    main()
