"""The import direction holds: serve_app -> neuron_workers <- compile, and inside neuron_workers
engine -> backends -> model (and parallel), never back. Read from the source with `ast`, so a new import
that runs up the layers fails here, wherever it sits in a module (top level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package (or neuron_workers subpackage) -> what it must never import
FORBIDDEN = {
    "neuron_workers": ("serve_app", "compile"),
    "compile": ("serve_app",),
    "neuron_workers.model": ("neuron_workers.engine", "neuron_workers.backends", "neuron_workers.artifacts",
                             "neuron_workers.factory", "neuron_workers.parallel.layers"),
    "neuron_workers.parallel": ("neuron_workers.engine", "neuron_workers.backends", "neuron_workers.artifacts",
                                "neuron_workers.factory"),
    "neuron_workers.backends": ("neuron_workers.engine", "neuron_workers.artifacts", "neuron_workers.factory"),
    "neuron_workers.engine": ("neuron_workers.factory", "neuron_workers.artifacts"),
    "neuron_workers.artifacts": ("neuron_workers.engine", "neuron_workers.factory"),
}


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


SOURCES = [p for pkg in ("neuron_workers", "serve_app", "compile") for p in (ROOT / pkg).rglob("*.py")]


def violations(path: Path) -> list[str]:
    name = module_name(path)
    bad = []
    for owner, banned in FORBIDDEN.items():
        if name == owner or name.startswith(owner + "."):
            bad += [f"{name} -> {m}" for m in imports(path) for b in banned if m == b or m.startswith(b + ".")]
    return bad


def test_no_import_runs_up_the_layers():
    assert len(SOURCES) > 40
    bad = [v for p in SOURCES for v in violations(p)]
    assert not bad, f"imports against the layering: {bad}"


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    (tmp_path / "neuron_workers" / "model").mkdir(parents=True)
    bad = tmp_path / "neuron_workers" / "model" / "x.py"
    bad.write_text("def f():\n    from neuron_workers.engine.engine import Engine\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert violations(bad) == ["neuron_workers.model.x -> neuron_workers.engine.engine"]
    finally:
        ROOT = old
