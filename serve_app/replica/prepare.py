"""A request made ready for the engine (in the engine process, on its reader thread, off the engine
thread): the prompt tokenized (a chat with its tools and template switches), its length checked, the
grammar compiled against the model's tokenizer (a grammar it cannot serve is a 400 naming the request
field), logprobs, and whether the text keeps control tokens for the router's parsers. Also the logprob
entries streamed back, token text included."""

from __future__ import annotations

import weakref

from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import ContextLengthError
from serve_app.events import GenerateRequest

_TEXTS: "weakref.WeakKeyDictionary[object, dict[int, str]]" = weakref.WeakKeyDictionary()


def new_sequence(engine, req: GenerateRequest):
    """Tokenize and validate; a sequence ready for `engine.add` (a UserError names the request field)."""
    if req.kind == "chat":
        check_text_length(engine, sum(len(m.get("content") or "") for m in req.messages), "messages")
        ids = chat_ids(engine, req)
    elif isinstance(req.prompt, str):
        check_text_length(engine, len(req.prompt), "prompt")
        ids = engine.encode(req.prompt)
    else:
        ids = list(req.prompt)
    max_tokens = req.max_tokens or max(engine.max_context - len(ids), 1)
    sampling = {**engine.sampling_defaults, **dict(req.sampling)}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=req.ignore_eos, **sampling)
    return engine.new_sequence(ids, params, list(req.stop), **sequence_options(engine, req))


def check_text_length(engine, chars: int, param: str) -> None:
    """Refuse, without tokenizing it, a text that cannot fit: no token is longer than
    `max_token_chars`, so it has at least chars / max_token_chars tokens."""
    at_least = chars // max(engine.max_token_chars, 1)
    if at_least > engine.max_context:
        raise ContextLengthError(f"this model's context is {engine.max_context} tokens; the {param} has "
                                 f"{chars} characters, at least {at_least} tokens", param=param)


def chat_ids(engine, req: GenerateRequest) -> list[int]:
    return engine.encode_chat(list(req.messages), tools=list(req.tools) or None, **dict(req.template_kwargs))


def sequence_options(engine, req: GenerateRequest) -> dict:
    """Keyword arguments of `Engine.new_sequence` for this request."""
    opts: dict = {}
    if req.grammar is not None:
        opts["grammar"] = engine.grammars.compile(req.grammar, req.grammar_param or "response_format")
    if req.logprobs is not None:
        opts["logprobs"] = req.logprobs
    if req.keep_special:
        opts["skip_special_tokens"] = False
    return opts


def token_text(tokenizer, token_id: int) -> str:
    """A token's own text, decoded once per tokenizer and token (logprobs ask for it per token per step)."""
    if tokenizer is None:
        return str(token_id)
    texts = _TEXTS.setdefault(tokenizer, {})
    text = texts.get(token_id)
    if text is None:
        text = texts[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
    return text


def logprob_entry(tokenizer, ev) -> dict:
    """OpenAI's chat shape for one token: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}."""
    def one(t: int, lp: float) -> dict:
        s = token_text(tokenizer, t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    return {**one(ev.token_id, ev.logprob), "top_logprobs": [one(t, lp) for t, lp in ev.top]}
