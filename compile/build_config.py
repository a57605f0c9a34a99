"""`compile build --config`: the models of a serve config, built as that config serves them.

One model (or `--model NAME`): built in this process. Several: each in a process of its own
(`python -m compile build --config C --model NAME`), its NeuronCores set in NEURON_RT_VISIBLE_CORES before
it starts: the Neuron runtime binds the cores it sees once per process, and NxDParallelState is entered
once per process (NxD never tests entering it again for another model). A model whose artifacts already
hold a manifest is skipped, saying so (an earlier run built it); the first model that fails stops the run,
which names what was built, what failed and the command that resumes (its compiled graphs are kept:
`neuron_workers/backends/neuron_compile.py`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from compile.build import CORES_VAR, build, default_cores
from compile.serve_config import read_serve_config, select
from neuron_workers.errors import UserError


def build_config(config: str, model: str | None, jobs: int, cores: str | None, argv=(), run=subprocess.run) -> int:
    _, entries = read_serve_config(config)
    chosen = select(entries, model)
    for e in chosen:
        if not e.engine.artifacts:
            raise UserError(f"model {e.name!r} in {config} names no `artifacts` directory to build into")
    todo = []
    for e in chosen:
        if (Path(e.engine.artifacts) / "manifest.json").exists():
            print(f"== {e.name}: {e.engine.artifacts} already holds a build (manifest.json): skipped "
                  f"(remove that directory to rebuild)", flush=True)
        else:
            todo.append(e)
    if len(todo) == 1:
        e = todo[0]
        print(f"== {e.name}: {e.engine.model} -> {e.engine.artifacts}", flush=True)
        hint = f"run `python -m compile build --config {shlex.quote(config)} --model {shlex.quote(e.name)}` again"
        build(e.engine, progress=lambda m: print(m, flush=True), jobs=jobs, cores=cores, resume_hint=hint)
        return 0
    done = []
    for i, e in enumerate(todo):
        env = dict(os.environ)
        env[CORES_VAR] = default_cores(e.engine.tp, cores)
        cmd = [sys.executable, "-m", "compile", "build", "--config", config, "--model", e.name, "--jobs", str(jobs)]
        print(f"== {e.name}: {e.engine.model} -> {e.engine.artifacts}, in a process of its own on NeuronCores "
              f"{env[CORES_VAR]}", flush=True)
        rc = run(cmd, env=env).returncode
        if rc:
            left = [x.name for x in todo[i + 1:]]
            print(f"error: {e.name} failed (exit {rc}); built: {done or 'none'}; not started: {left or 'none'}. "
                  f"Compiled graphs are kept in {Path(e.engine.artifacts) / 'neff_cache'}: run "
                  f"`python -m compile {' '.join(shlex.quote(a) for a in argv) or 'build --config ' + config}` "
                  f"again to resume (built models are skipped)", file=sys.stderr, flush=True)
            return rc if rc > 0 else 1
        done.append(e.name)
    return 0
