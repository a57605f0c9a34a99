"""The import direction holds: serve_app -> neuron_workers <- compile, and inside neuron_workers
engine -> backends -> model (and parallel), never back. Inside serve_app the top (app, router, run, config)
ties three rooms together: `openai` (the OpenAI surface) and `ops` import neither `replica` nor each other,
`replica` may use `ops` (metrics, nodes) but never `openai`, and `events` (the router <-> replica contract)
imports none of them. No module imports itself back through others: no cycle anywhere. Read from the source
with `ast`, so a new import fails here wherever it sits in a module (top level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("serve_app.app", "serve_app.router", "serve_app.run", "serve_app.http")  # what ties the rooms together
# package (or subpackage, or module) -> what it must never import
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
    "serve_app.openai": ("serve_app.replica", "serve_app.ops", *TOP),
    "serve_app.ops": ("serve_app.replica", "serve_app.openai", *TOP),
    "serve_app.replica": ("serve_app.openai", *TOP),
    "serve_app.events": ("serve_app.replica", "serve_app.openai", "serve_app.ops", "serve_app.config", *TOP),
    "serve_app.config": ("serve_app.replica", "serve_app.openai", *TOP),
}


def imports(path: Path) -> set[str]:
    """Every module `path` imports; `from pkg import mod` counts as `pkg.mod` when that is a module of ours."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules()
            out |= subs or {node.module}
    return out


def modules() -> set[str]:
    return {module_name(p).removesuffix(".__init__") for p in sources()}


def sources() -> list[Path]:
    return [p for pkg in ("neuron_workers", "serve_app", "compile") for p in (ROOT / pkg).rglob("*.py")]


def cycles() -> list[list[str]]:
    """Strongly connected groups of two or more modules (or a module importing itself), over our modules."""
    ours = modules()
    graph = {module_name(p).removesuffix(".__init__"): sorted(imports(p) & ours) for p in sources()}
    index, low, stack, found, counter = {}, {}, [], [], [0]

    def visit(v):  # Tarjan's algorithm; the tree is small, recursion is fine
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1 or v in graph[v]:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def violations(path: Path) -> list[str]:
    name = module_name(path)
    bad = []
    for owner, banned in FORBIDDEN.items():
        if name == owner or name.startswith(owner + "."):
            bad += [f"{name} -> {m}" for m in imports(path) for b in banned if m == b or m.startswith(b + ".")]
    return bad


def test_no_import_runs_up_the_layers():
    assert len(sources()) > 40
    bad = [v for p in sources() for v in violations(p)]
    assert not bad, f"imports against the layering: {bad}"


def test_no_import_cycle():
    assert not cycles(), f"import cycles: {cycles()}"


def test_serve_app_keeps_at_most_eight_modules_at_its_top():
    top = sorted(p.name for p in (ROOT / "serve_app").glob("*.py"))
    assert len(top) <= 8, top


def test_the_checks_see_a_cycle_and_a_room_importing_the_replica(tmp_path):
    global ROOT
    for name, text in {"serve_app/__init__.py": "", "serve_app/openai/__init__.py": "",
                       "serve_app/openai/a.py": "from serve_app.openai import b\n",
                       "serve_app/openai/b.py": "def f():\n    from serve_app.replica.c import x\n",
                       "serve_app/replica/__init__.py": "",
                       "serve_app/replica/c.py": "import serve_app.openai.a\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    old, ROOT = ROOT, tmp_path
    try:
        assert cycles() == [["serve_app.openai.a", "serve_app.openai.b", "serve_app.replica.c"]]
        assert violations(tmp_path / "serve_app/openai/b.py") == ["serve_app.openai.b -> serve_app.replica.c"]
        assert violations(tmp_path / "serve_app/replica/c.py") == ["serve_app.replica.c -> serve_app.openai.a"]
    finally:
        ROOT = old


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
