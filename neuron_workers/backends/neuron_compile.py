"""Compiling a build's traced graphs: riskiest first and alone (`decode`), then the rest (`risk_order`: the other
decode, the draft graph, the extend graphs, the prefill buckets); every NEFF kept in a cache keyed by graph, HLO
(serialized deterministically), flags (and NEURON_CC_FLAGS) and the compiler libraries' versions (`cache_key`), so
a failed or interrupted build resumes where it stopped (a build that adds graphs, such as extend graphs for a chunk
size, compiles only those). The compiler work directory keeps the newest
KEEP_WORKDIRS runs of each graph (`prune_workdir`).

This replaces `ModelBuilder.compile`, which compiles every graph in its pool before it raises (a failing
graph is known only at the end) and runs neuronx-cc with `use_cache=False` (a retry recompiles all). We call
the ModelBuilder V2 fundamental units it calls itself (NxD 0.19 `trace/model_builder_v2.py`: without a
priority model it is `trace.functions.compile` per graph, then `NxDModel(world_size, layout_transformer=None)`
and `add(key, trace_artifacts, compilation_artifacts)` per graph, in trace order).

Weight layout optimization (`weight_layout`, GEMMA4_WEIGHT_LAYOUT=1 at build; off until measured), as ModelBuilder
V2 does it with a priority model and NxD Inference asks for it (its token-generation graph as the priority): the
priority graph (`decode`, or `decode_h` with a drafter: the first of `risk_order`) has its weights marked
(`hlo_utils.mark_weights_for_wlo`) and compiles through `compile_wlo`, which lets neuronx-cc choose the weights'
device layout for it; `compile_layout_transformer` makes the graph that lays the weights out so once at load, and
every other graph's HLO is rewritten to read them in that layout (`hlo_utils.apply_layout_transformation`) before
its own compile; the NxDModel holds the layout transformer. The priority graph is then always compiled (its layout
is what the others are rewritten to; the others stay cached by their rewritten HLO).

WRITTEN AGAINST THE NxD CORE 0.19 SOURCE, NOT RUN ON HARDWARE HERE (tests/doubles/neuron_double_units.py
stands in). Unconfirmed: that tracing the same module twice gives byte-identical HLO; if it does not, the
cache misses and the graph is compiled again (time lost, never a wrong NEFF: the key is the HLO itself).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from neuron_workers.errors import UserError
from neuron_workers.model.spec import DECODE, DECODE_LOGITS, DRAFT

DECODE_H = f"{DECODE}_h"  # the top-K decode graph that also returns the hidden state (a build with a drafter)

CACHE_DIR, WORK_DIR = "neff_cache", "compiler_workdir"
LOG_FILE = "log-neuron-cc.txt"  # NxD's ModelBuilderConstants.LOG_FILE_DEFAULT_NAME, in workdir/<tag>/<timestamp>/
LOG_TAIL_LINES = 25
EXTEND_TAG = re.compile(r"(?:extend|mixed)_(\d+)x(\d+)(_logits|_all)?(?:_h)?")  # GraphSpec.tag: extend, mixed
PREFILL_TAG = re.compile(r"prefill_(\d+)")


def risk_order(tags) -> list[str]:
    """The order to compile in: `decode` (the top-K graph at the configured batch and the real vocabulary:
    the one most likely to be refused; `decode_h` in a build with a drafter), `decode_logits`, `draft`, the extend
    and mixed graphs (largest rows x T first, each shape's top-K variants before its `_logits`; by tag at a tie),
    then the prefill buckets, largest first."""
    def rank(tag: str) -> tuple:
        if tag in (DECODE, DECODE_H, DECODE_LOGITS, DRAFT):
            return ({DECODE: 0, DECODE_H: 0, DECODE_LOGITS: 1, DRAFT: 1.5}[tag], 0, False, tag)
        m = EXTEND_TAG.fullmatch(tag)
        if m:
            return (2, -int(m[1]) * int(m[2]), m[3] == "_logits", tag)
        m = PREFILL_TAG.fullmatch(tag)
        return (3, -int(m[1]) if m else 0, False, tag)

    return sorted(tags, key=rank)


KEY_PACKAGES = ("neuronx-cc", "libneuronxla", "torch-neuronx", "neuronx-distributed")  # what makes a NEFF
FLAGS_ENV = "NEURON_CC_FLAGS"  # flags neuronx-cc adds from the environment (libneuronxla reads it)
KEEP_WORKDIRS = 2  # compiler work directories kept per graph (the newest: a failed one's log is shown)


def cache_key(tag: str, hlo, flags: str, compiler: str) -> str:
    """The NEFF cache key: the tag, the HLO serialized deterministically (protobuf's map fields otherwise come out
    in any order: the same graph would miss the cache), the flags, NEURON_CC_FLAGS and the compiler libraries'
    versions (`compiler`, `compiler_version`)."""
    h = hashlib.sha256()
    for part in (tag.encode(), serialized(hlo), flags.encode(), os.environ.get(FLAGS_ENV, "").encode(),
                 compiler.encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:20]


def serialized(hlo) -> bytes:
    try:
        return hlo.SerializeToString(deterministic=True)
    except TypeError:  # not a protobuf message (it takes the keyword)
        return hlo.SerializeToString()


def compiler_version() -> str:
    """The versions of every package that shapes a NEFF, `name=version;...` (`unknown` for one not installed)."""
    from importlib import metadata

    out = []
    for pkg in KEY_PACKAGES:
        try:
            out.append(f"{pkg}={metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            out.append(f"{pkg}=unknown")
    return ";".join(out)


def prune_workdir(workdir: Path, keep: int = KEEP_WORKDIRS) -> int:
    """Bound the compiler work directory: NxD leaves `workdir/<tag>/<run>/` (HLO, NEFF, logs: GBs for the real
    graphs) on every compile; keep the `keep` newest runs per graph. Returns how many were removed."""
    removed = 0
    for tag_dir in (d for d in workdir.iterdir() if d.is_dir()) if workdir.is_dir() else ():
        runs = sorted((d for d in tag_dir.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
        for old in runs[keep:]:
            shutil.rmtree(old, ignore_errors=True)
            removed += 1
    return removed


class CompileFailed(UserError):
    """A graph did not compile: names it, shows its compiler log's tail, says how to resume."""


def compile_graphs(builder, flags: dict[str, str], out_dir: Path, jobs: int, progress, resume_hint: str = "",
                   weight_layout: bool = False):
    """An NxDModel of every graph `builder` traced (compiled or taken from the cache); `weight_layout`: with the
    weight layout optimization (module docstring)."""
    from neuronx_distributed.trace.functions import compile as nxd_compile
    from neuronx_distributed.trace.model_builder_utils import CompilationArtifacts
    from neuronx_distributed.trace.nxd_model import NxDModel

    arts = builder.trace_artifacts_collection
    cache, workdir = out_dir / CACHE_DIR, out_dir / WORK_DIR
    cache.mkdir(parents=True, exist_ok=True)
    version = compiler_version()
    order = risk_order(list(arts))

    def one(tag: str):
        kept = cache / f"{tag}-{cache_key(tag, arts[tag].hlo, flags[tag], version)}.neff"
        if kept.exists():
            progress(f"{tag}: compiled by an earlier run, reused ({kept})")
            return CompilationArtifacts(str(kept))
        t = time.perf_counter()
        progress(f"{tag}: compiling ({flags[tag]})")
        art = nxd_compile(arts[tag].hlo, arts[tag].metaneff, str(workdir), flags[tag], tag)
        part = kept.with_suffix(".part")
        shutil.copyfile(art.neff_filepath, part)
        part.replace(kept)  # whole or absent: an interrupted copy is never reused
        progress(f"{tag}: compiled in {time.perf_counter() - t:.0f}s, kept in {kept}")
        return CompilationArtifacts(str(kept))

    results, layout = {}, None
    try:  # alone: if the riskiest graph fails, nothing else was spent
        if weight_layout:
            results[order[0]], layout = priority_layout(arts, order, flags, workdir, progress)
        else:
            results[order[0]] = one(order[0])
    except Exception as e:
        error = _failed(order[0], e, workdir, cache, resume_hint)
        prune_workdir(workdir)
        raise error from e
    failed: dict[str, Exception] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, tag): tag for tag in order[1:]}
        for f in as_completed(futures):  # the others finish (and are kept) even when one fails
            try:
                results[futures[f]] = f.result()
            except Exception as e:
                failed[futures[f]] = e
    if failed:
        tag = next(t for t in order if t in failed)
        error = _failed(tag, failed[tag], workdir, cache, resume_hint, others=sorted(set(failed) - {tag}))
        prune_workdir(workdir)
        raise error
    removed = prune_workdir(workdir)
    if removed:
        progress(f"compiler work directory {workdir}: {removed} older runs removed (the {KEEP_WORKDIRS} newest kept)")
    model = NxDModel(world_size=builder.world_size, layout_transformer=layout)
    for tag in arts:  # trace order: the first graph's state is the model's state
        model.add(key=tag, trace_artifacts=arts[tag], compilation_artifacts=results[tag])
    return model


def priority_layout(arts: dict, order: list[str], flags: dict[str, str], workdir: Path, progress):
    """Weight layout optimization: (the priority graph `order[0]` compiled with `compile_wlo`, the layout transformer);
    every other graph's HLO is rewritten to the chosen layout (before it is keyed and compiled)."""
    from neuronx_distributed.trace import hlo_utils
    from neuronx_distributed.trace.functions import compile_layout_transformer, compile_wlo

    prio = order[0]
    t = time.perf_counter()
    progress(f"{prio}: compiling as the priority graph of the weight layout optimization ({flags[prio]})")
    hlo_utils.mark_weights_for_wlo(trace_artifacts=arts[prio], weights_to_skip_layout_optimization=None)
    wlo = compile_wlo(hlo_module=arts[prio].hlo, metaneff=arts[prio].metaneff, compiler_workdir=str(workdir),
                      compiler_args=flags[prio], key=prio)
    layout = compile_layout_transformer(wlo_artifacts=wlo,
                                        priority_model_weight_name_to_idx=arts[prio].weight_name_to_idx,
                                        compiler_workdir=str(workdir))
    for tag in order[1:]:
        hlo_utils.apply_layout_transformation(trace_artifacts=arts[tag], priority_model_trace_artifacts=arts[prio],
                                              wlo_artifacts=wlo, key=tag)
    progress(f"{prio}: compiled with its weight layout in {time.perf_counter() - t:.0f}s; the other "
             f"{len(order) - 1} graphs rewritten to it")
    return wlo, layout


def _failed(tag, error, workdir: Path, cache: Path, resume_hint: str, others=()) -> CompileFailed:
    logs = sorted((workdir / tag).glob(f"*/{LOG_FILE}"), key=lambda p: p.stat().st_mtime)
    tail = ""
    if logs:
        lines = logs[-1].read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        tail = f"\n--- {logs[-1]} (last {len(lines)} lines) ---\n" + "\n".join(lines) + "\n---"
    kept = len(list(cache.glob("*.neff")))
    also = f" (also failed: {', '.join(others)})" if others else ""
    return CompileFailed(f"graph {tag} did not compile: {type(error).__name__}: {error}{also}{tail}\n"
                         f"{kept} compiled graphs are kept in {cache}; {resume_hint or 'run the same command again'}"
                         f" to resume: graphs already compiled with the same HLO and flags are not compiled again")
