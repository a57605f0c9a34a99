"""Reading the serve YAML (configs/*.yaml) for `compile build --config` and `compile plan --config`: one
source of truth for tp, context, buckets, batch, dtype and an MTP drafter (`draft_model`, resolved like `path`), as
`neuron_workers.config.EngineConfig` (the schema the serve app uses too). Plain YAML reading, no Ray or serve_app
import (imports run serve_app -> neuron_workers <- compile)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from neuron_workers.config import EngineConfig
from neuron_workers.errors import UserError


@dataclass(frozen=True)
class ServedModel:
    name: str
    engine: EngineConfig


def read_serve_config(path: str | Path) -> tuple[str | None, list[ServedModel]]:
    """(the instance the file is sized for, its models), paths resolved against the file's project root
    (the directory `serve run` is started in: the parent of configs/)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"no serve config at {path}")
    try:
        doc = yaml.safe_load(p.read_text()) or {}
        args = doc["applications"][0]["args"]
        models = args["models"]
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as e:
        raise UserError(f"{path} is not a serve config with applications[0].args.models: {e}") from None
    root = p.resolve().parent.parent if p.resolve().parent.name == "configs" else p.resolve().parent
    fix = lambda v: None if v is None else str(v if Path(v).is_absolute() else root / v)  # noqa: E731
    out = []
    for m in models:
        try:
            cfg = EngineConfig.from_mapping({**m, "artifacts": fix(m.get("artifacts")),
                                             "draft_model": fix(m.get("draft_model"))}, model=fix(m["path"]))
            out.append(ServedModel(m["name"], cfg))
        except UserError as e:
            raise UserError(f"{path}: model {m.get('name')!r}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{path}: model entry {m!r} is incomplete: {e}") from None
    return args.get("instance"), out


def select(entries: list[ServedModel], name: str | None) -> list[ServedModel]:
    if name is None:
        return entries
    chosen = [e for e in entries if e.name == name]
    if not chosen:
        raise UserError(f"no model named {name!r} in the config; it has {', '.join(e.name for e in entries)}")
    return chosen
