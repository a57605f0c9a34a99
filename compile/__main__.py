"""python -m compile {build,plan} ...

  build  --model DIR --tp {1,2} --batch B --max-context N [--prefill-buckets 128,512] --out DIR
         [--backend neuron|cpu] [--dtype bfloat16]   trace + compile the graphs, write artifacts + manifest
  plan   --model DIR_OR_CONFIG --tp N --batch B --max-context N [--instance inf2.xlarge|...] [--json]
         per-core HBM and host RAM; exits 2 with the numbers when the model does not fit
"""

from __future__ import annotations

import argparse
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
    b = sub.add_parser("build", help="trace and compile the prefill buckets and the decode graph")
    b.add_argument("--model", required=True)
    b.add_argument("--tp", type=int, default=1)
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--max-context", type=int)
    b.add_argument("--prefill-buckets", type=_ints)
    b.add_argument("--backend", default="neuron", choices=["neuron", "cpu"])
    b.add_argument("--dtype", help="default: bfloat16 on neuron, float32 on cpu")
    b.add_argument("--out", required=True)
    p = sub.add_parser("plan", help="will it fit? per-core HBM and host RAM")
    p.add_argument("--model", required=True, help="checkpoint directory or config .json")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--prefill-bucket", type=int, help="largest prefill bucket (default: max context)")
    p.add_argument("--instance", default="inf2.24xlarge")
    p.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        if args.cmd == "build":
            from compile.build import build

            dtype = args.dtype or ("bfloat16" if args.backend == "neuron" else "float32")
            build(args.model, args.backend, args.tp, args.batch, args.max_context, args.prefill_buckets, dtype,
                  args.out, progress=lambda m: print(m, flush=True))
            return 0
        from compile.plan import format_plan, load_text_config, make_plan_report, plan_json

        if args.batch < 1:
            raise UserError("--batch must be >= 1")
        report = make_plan_report(load_text_config(args.model), args.tp, args.batch, args.max_context,
                                  args.instance, args.prefill_bucket)
        print(plan_json(report) if args.json else format_plan(report))
        return 0 if report.fits else 2
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
