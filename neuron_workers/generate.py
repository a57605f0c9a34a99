"""Command-line generation on one checkpoint:

    python -m neuron_workers.generate --model DIR (--prompt TEXT | --prompt-ids 5,6,7)... --max-tokens N
        [--temperature T --top-k K --top-p P --seed S] [--chat] [--json] [--tp 2] [--max-batch B]
        [--repetition-penalty R --frequency-penalty F --presence-penalty P --logit-bias ID=BIAS ...]

One prompt streams its text to stdout as it is generated, or prints one JSON object with `--json`
(`token_ids`: the generated ids only, `text`, `finish_reason`, timing). Several prompts (repeat
--prompt or --prompt-ids) are decoded together, up to --max-batch at a time, and print one JSON object
per line in the order given. A user mistake prints one `error:` line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from neuron_workers.config import BACKENDS
from neuron_workers.errors import UserError


def parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None


def parse_bias(text: str) -> tuple[int, float]:
    token, sep, bias = text.partition("=")
    try:
        if not sep or not (token.isascii() and token.isdigit()):
            raise ValueError
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be TOKEN_ID=BIAS, e.g. 106=-100, got {text!r}") from None


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m neuron_workers.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    ap.add_argument("--prompt", action="append", default=[], help="prompt text (needs the checkpoint's tokenizer)")
    ap.add_argument("--prompt-ids", action="append", type=parse_ids, default=[], help="prompt token ids, e.g. 2,105,9")
    ap.add_argument("--chat", action="store_true", help="wrap --prompt as a user turn with the chat template")
    ap.add_argument("--max-tokens", "--max-new-tokens", dest="max_tokens", type=int, default=64,
                    help="tokens to generate at most (--max-new-tokens is the same)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--repetition-penalty", type=float, default=1.0,
                    help="1 = off; > 1 discourages tokens of the prompt and the output (transformers' rule)")
    ap.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2]: minus F x the token's count")
    ap.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2]: minus P once a token appeared")
    ap.add_argument("--logit-bias", action="append", type=parse_bias, default=[], metavar="ID=BIAS",
                    help="add BIAS (in [-100, 100]) to token ID's logit; repeatable")
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence ids")
    ap.add_argument("--backend", default="cpu", choices=list(BACKENDS),
                    help="cpu (default), xla (the traced module on a torch-xla CPU device) or neuron (artifacts)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    ap.add_argument("--max-context", type=int, help="KV-cache length (default: min(model, 1024))")
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    ap.add_argument("--cpu-mode", default="eager", choices=["eager", "export", "inductor"],
                    help="cpu backend: eager modules, strict torch.export programs, or torch.compile")
    ap.add_argument("--artifacts", help="compiled graphs from `python -m compile build`")
    ap.add_argument("--max-batch", type=int, help="sequences decoded together (default 1, or the artifacts')")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch host threads (default 1: fastest for the graphs' small host ops)")
    ap.add_argument("--prefill-chunk", type=int,
                    help="prefill prompts longer than N in chunks of N, between decode steps (0: off; default: "
                         "the backend's, see neuron_workers.config.PREFILL_CHUNK_DEFAULTS)")
    ap.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                    help="prefill every prompt whole (default: a prompt that starts as an earlier sequence did "
                         "reuses the KV its slot kept)")
    ap.add_argument("--speculative-method", choices=["ngram"],
                    help="speculative decoding: ngram = prompt-lookup drafts, verified by the target model")
    ap.add_argument("--draft-model", help="speculative decoding with an MTP drafter: a gemma4_assistant checkpoint (a "
                                          "gemma4_unified_assistant one for 12B targets) "
                                          "directory (google/gemma-4-*-it-assistant; cpu or xla backend, or "
                                          "neuron artifacts built with `compile build --draft-model`)")
    ap.add_argument("--num-speculative-tokens", type=int, help="drafts per step (default 4 with a drafter)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    args = ap.parse_args(argv)
    if not args.prompt and not args.prompt_ids:
        ap.error("one of --prompt or --prompt-ids is required")
    if args.prompt and args.prompt_ids:
        ap.error("use --prompt or --prompt-ids, not both")
    return args


def run(args) -> list[dict]:
    from neuron_workers.config import EngineConfig
    from neuron_workers.engine.params import SamplingParams
    from neuron_workers.factory import build_engine

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos,
                            repetition_penalty=args.repetition_penalty, frequency_penalty=args.frequency_penalty,
                            presence_penalty=args.presence_penalty, logit_bias=tuple(args.logit_bias))
    engine = build_engine(EngineConfig(model=args.model, backend=args.backend, tp=args.tp,
                                       max_context=args.max_context, dtype=args.dtype, cpu_mode=args.cpu_mode,
                                       artifacts=args.artifacts, threads=args.threads,
                                       prefill_chunk=args.prefill_chunk, prefix_cache=args.prefix_cache,
                                       speculative_method=args.speculative_method,
                                       num_speculative_tokens=args.num_speculative_tokens,
                                       draft_model=args.draft_model,
                                       max_batch=args.max_batch or (None if args.artifacts else 1)))
    try:
        if args.prompt:
            prompts = [engine.encode_chat([{"role": "user", "content": p}]) if args.chat else engine.encode(p)
                       for p in args.prompt]
        else:
            prompts = args.prompt_ids
        return _generate(engine, prompts, params, stream=not args.json and len(prompts) == 1)
    finally:
        engine.close()


def _generate(engine, prompts, params, stream: bool) -> list[dict]:
    from neuron_workers.engine.events import ErrorEvent

    seqs = [engine.new_sequence(ids, params) for ids in prompts]
    start = time.perf_counter()
    rows = {s.seq_id: {"tokens": [], "text": [], "first": None, "finish": None} for s in seqs}
    for ev in engine.run_all(seqs):
        if isinstance(ev, ErrorEvent):
            raise RuntimeError(ev.message)
        row = rows[ev.seq_id]
        row["first"] = row["first"] or time.perf_counter()
        row["tokens"].append(ev.token_id)
        row["text"].append(ev.text)
        row["finish"] = ev.finish_reason
        if stream and ev.text:
            print(ev.text, end="", flush=True)
    end = time.perf_counter()
    if stream:
        print()
    return [_summary(engine, s.prompt_ids, rows[s.seq_id], start, end) for s in seqs]


def _summary(engine, ids, row, start, end) -> dict:
    tokens, decode_s = row["tokens"], end - row["first"]
    return {"prompt_ids": ids, "token_ids": tokens, "text": "".join(row["text"]) if engine.tokenizer else None,
            "finish_reason": row["finish"], "ttft_s": round(row["first"] - start, 4),
            "decode_tokens_per_s": round((len(tokens) - 1) / decode_s, 2) if len(tokens) > 1 and decode_s else None}


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        out = run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable files surface here
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json or len(out) > 1:
        for row in out:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
