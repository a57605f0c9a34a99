"""Ray Serve app: OpenAI-compatible HTTP in front of one deployment per Gemma-4 model.

Public API: `build_app` (the `serve run` builder), `AppArgs` and `ModelSpec` (its arguments).
"""

from serve_app.config import AppArgs, ModelSpec

__all__ = ["AppArgs", "ModelSpec", "build_app"]


def __getattr__(name):  # build_app imports ray: only when asked for
    if name == "build_app":
        from serve_app.app import build_app

        return build_app
    raise AttributeError(name)
