"""The replica's side of a request's agentic options (runs on its worker thread, off the engine thread):
the chat prompt with tools and template switches, the grammar compiled against the model's tokenizer
(a grammar it cannot serve is a 400 naming the request field), logprobs, and whether the text keeps control
tokens for the router's parsers. Also the logprob entries the replica streams back, token text included."""

from __future__ import annotations

import weakref

from serve_app.events import GenerateRequest

_TEXTS: "weakref.WeakKeyDictionary[object, dict[int, str]]" = weakref.WeakKeyDictionary()


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
