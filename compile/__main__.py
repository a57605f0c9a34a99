"""python -m compile {build,plan,hlo,kuberay,smoke} ...

  build  --model DIR --out DIR [--tp N --batch B --max-context N --prefill-buckets 128,512 --dtype D]
         [--backend neuron|cpu] [--jobs J] [--cores 0-1] [--prefill-chunk N] [--num-speculative-tokens K]
         [--draft-model DIR]
         trace + compile the graphs, write artifacts + manifest (a neuron build pins NEURON_RT_VISIBLE_CORES:
         --cores, else the variable, else the first tp cores; it adds the extend graphs extend_1xN and
         extend_1xN_logits of chunked prefill: N default 256 when the sliding ring holds it, 0 none, and
         the mixed graphs mixed_BxN and mixed_BxN_logits, a chunk beside every slot's decode token; with K
         the verify graph extend_BxK+1_all of speculative decoding; with an MTP drafter (neuron) the draft
         graph and the _h variants of the candidate graphs: decode_h, extend_1xN_h, mixed_BxN_h,
         extend_BxK+1_all_h, K default 4)
  build  --config configs/inf2.yaml [--model NAME] [--jobs J]
         the same for the models of a serve config, with its tp, context, buckets, max_batch, dtype and
         artifacts directory (one source of truth: what is built is what that config serves); several
         models: each in a process of its own, its cores pinned before it starts (compile/build_config.py)
         (its `prefill_chunk` too); a neuron build compiles `decode` first and alone, keeps every compiled
         graph in OUT/neff_cache and says how to resume when a graph fails
  plan   --model DIR_OR_CONFIG_JSON [--tp N --batch B --max-context N --instance inf2.24xlarge] [--json]
         [--draft-model DIR]   with an MTP drafter: its HBM (weights; it adds no KV) and the bytes a draft step
         reads, from its config.json
  plan   --config configs/inf2.yaml [--model NAME]     each model as configured (its draft_model too), on the
         config's instance
         (a model whose checkpoint is not here is planned from configs/model-configs/, with a note on stderr)
         per-core HBM and host RAM; exits 2 with the numbers when a model does not fit
  hlo    --model DIR --out DIR [--batch B --max-context N --prefill-buckets 16,32 --dtype D] [--draft-model DIR]
         each graph's HLO text from the xla twin (needs torch-xla) and audit.json (compile/hlo.py): to diff
         against neuronx-cc's graph.hlo on the first inf2 run
  kuberay --config configs/inf2.yaml [--check]   the KubeRay RayService for EKS generated from that config
         (configs/kuberay/rayservice.yaml; --check exits 1 when it has drifted)
  smoke  the inf2 hardware smoke test (compile/smoke.py): versions, a toy ModelBuilder model, tiny
         checkpoints at tp 1 and 2 against the CPU backend (prefill, decode, extend and mixed graphs, and the
         draft graph of a tiny MTP drafter); PASS/FAIL per step
"""

from __future__ import annotations

import argparse
import shlex
import sys

from neuron_workers.errors import UserError


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m compile", description="Compile and plan Gemma-4 graphs for inf2")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="trace and compile the prefill buckets, the two decode graphs and (neuron) "
                                     "the extend graphs of chunked prefill")
    b.add_argument("--model", help="checkpoint directory (with --config: a model name in it)")
    b.add_argument("--config", help="a serve YAML (configs/inf2.yaml): build its models as it serves them")
    b.add_argument("--tp", type=int, default=1)
    b.add_argument("--batch", type=int, default=1, help="sequences decoded together (the serve config's max_batch)")
    b.add_argument("--max-context", type=int)
    b.add_argument("--prefill-buckets", type=_ints)
    b.add_argument("--backend", default="neuron", choices=["neuron", "cpu"])
    b.add_argument("--dtype", help="default: bfloat16 on neuron, float32 on cpu")
    b.add_argument("--out", help="artifact directory (with --config: the config's `artifacts`)")
    b.add_argument("--jobs", type=int, default=1,
                   help="neuronx-cc processes at once (default 1: each can take tens of GB of host RAM)")
    b.add_argument("--prefill-chunk", type=int, help="neuron: T of the extend graphs of chunked prefill (default "
                                                     "256, when the sliding ring holds it; 0: none)")
    b.add_argument("--num-speculative-tokens", type=int,
                   help="neuron: also build the verify graph of speculative decoding (ngram) for K drafts a step")
    b.add_argument("--prefix-windows", type=int, help="neuron: kept sliding windows (prefix reuse past the rings; "
                                                      "their pool and save / restore / clone graphs; default 0)")
    b.add_argument("--draft-model", help="neuron: build the draft graph of this MTP drafter (a gemma4_assistant "
                                         "checkpoint) and the candidate graphs' _h variants")
    b.add_argument("--cores", help="NeuronCores the build may use, e.g. 2-3 (default: NEURON_RT_VISIBLE_CORES "
                                   "if set, else the first tp): keep clear of a running server's cores")
    p = sub.add_parser("plan", help="will it fit? per-core HBM and host RAM")
    p.add_argument("--model", help="checkpoint directory or config .json (with --config: a model name in it)")
    p.add_argument("--config", help="a serve YAML: plan each of its models as configured")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--prefill-bucket", type=int, help="largest prefill bucket (default: max context)")
    p.add_argument("--instance", default="inf2.24xlarge")
    p.add_argument("--draft-model", help="with --model: an MTP drafter (a gemma4_assistant checkpoint directory; "
                                         "its config.json is enough): its HBM and the bytes one draft step reads "
                                         "(with --config: each model's own draft_model)")
    p.add_argument("--json", action="store_true")
    k = sub.add_parser("kuberay", help="write (or --check) the KubeRay RayService generated from a serve config")
    k.add_argument("--config", default="configs/inf2.yaml")
    k.add_argument("--out", help="default: configs/kuberay/rayservice.yaml")
    k.add_argument("--check", action="store_true", help="exit 1 when the manifest has drifted from the config")
    h = sub.add_parser("hlo", help="write each graph's HLO text from the xla twin (torch-xla), with an audit")
    h.add_argument("--model", required=True, help="checkpoint directory")
    h.add_argument("--out", required=True, help="folder for <graph>.hlo.txt and audit.json")
    h.add_argument("--batch", type=int, default=1, help="sequences decoded together, as compile build --batch")
    h.add_argument("--max-context", type=int)
    h.add_argument("--prefill-buckets", type=_ints)
    h.add_argument("--dtype", default="bfloat16", help="default bfloat16, as a neuron build")
    h.add_argument("--draft-model", help="also the draft graph of this MTP drafter (and the _h candidate graphs)")
    sm = sub.add_parser("smoke", help="hardware smoke test on an inf2 host")
    sm.add_argument("step", nargs="?", choices=["sdk", "topk", "toy", "tp1", "tp2"], help="run one step (internal)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.cmd in ("build", "plan") and not (args.model or args.config):
        ap.error("--model or --config is required")
    if args.cmd == "build" and not args.config and not args.out:
        ap.error("--out is required without --config")
    return args


def _build(args) -> int:
    from compile.build import build

    if args.jobs < 1:
        raise UserError("--jobs must be >= 1")
    if not args.config:
        from neuron_workers.config import EngineConfig

        dtype = args.dtype or ("bfloat16" if args.backend == "neuron" else "float32")
        cfg = EngineConfig(model=args.model, backend=args.backend, tp=args.tp, max_context=args.max_context,
                           prefill_buckets=args.prefill_buckets, dtype=dtype, artifacts=args.out,
                           max_batch=args.batch, prefill_chunk=args.prefill_chunk,
                           speculative_method="ngram" if args.num_speculative_tokens and not args.draft_model
                           else None, num_speculative_tokens=args.num_speculative_tokens or None,
                           draft_model=args.draft_model, prefix_windows=args.prefix_windows)
        hint = "run `python -m compile " + " ".join(shlex.quote(a) for a in args.argv) + "` again"
        build(cfg, progress=lambda m: print(m, flush=True), jobs=args.jobs, cores=args.cores, resume_hint=hint)
        return 0
    from compile.build_config import build_config

    return build_config(args.config, args.model, args.jobs, args.cores, args.argv)


def _plan(args) -> int:
    from compile.plan import (
        config_or_bundled,
        format_plan,
        load_drafter_info,
        load_text_config,
        make_plan_report,
        plan_json,
    )

    if args.batch < 1:
        raise UserError("--batch must be >= 1")
    if not args.config:
        jobs = [(args.model, args.tp, args.batch, args.max_context, args.instance, args.prefill_bucket,
                 args.draft_model)]
    else:
        from compile.serve_config import read_serve_config, select

        instance, entries = read_serve_config(args.config)
        if not instance:
            raise UserError(f"{args.config} names no `instance` in its args: say which inf2 size it is for")
        jobs = [(e.engine.model, e.engine.tp, e.engine.batch, e.engine.max_context or 4096, instance,
                 max(e.engine.prefill_buckets) if e.engine.prefill_buckets else None,
                 e.engine.draft_model)
                for e in select(entries, args.model)]
    fits = True
    for model, tp, batch, ctx, instance, bucket, draft in jobs:
        cfg = config_or_bundled(model, lambda m: print(m, file=sys.stderr)) if args.config else load_text_config(model)
        report = make_plan_report(cfg, tp, batch, ctx, instance, bucket, load_drafter_info(draft) if draft else None)
        print(plan_json(report) if args.json else format_plan(report))
        fits &= report.fits
    return 0 if fits else 2


def _hlo(args) -> int:
    from compile.hlo import write_hlo
    from neuron_workers.config import EngineConfig

    cfg = EngineConfig(model=args.model, backend="xla", max_context=args.max_context,
                       prefill_buckets=args.prefill_buckets, dtype=args.dtype, max_batch=args.batch,
                       draft_model=args.draft_model)
    write_hlo(cfg, args.out, progress=lambda m: print(m, flush=True))
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    try:
        if args.cmd in ("build", "hlo", "smoke"):  # before torch_xla is imported: every gather lowers sparsely
            from neuron_workers.backends.neuron import force_sparse_gathers

            force_sparse_gathers()
        if args.cmd == "build":
            return _build(args)
        if args.cmd == "plan":
            return _plan(args)
        if args.cmd == "hlo":
            return _hlo(args)
        if args.cmd == "kuberay":
            from compile.kuberay import main as kuberay

            return kuberay(args.config, args.out, args.check)
        from compile.smoke import main as smoke

        return smoke([args.step] if args.step else [])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
