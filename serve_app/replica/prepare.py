"""A request made ready for the engine (in the engine process, on its reader thread, off the engine
thread): the prompt tokenized (a chat with its tools and template switches; its images and audio decoded,
expanded into soft tokens by transformers' processor and encoded), its length checked, the
grammar compiled against the model's tokenizer (a grammar it cannot serve is a 400 naming the request
field), logprobs, and whether the text keeps control tokens for the router's parsers. Also the logprob
entries streamed back, token text included."""

from __future__ import annotations

import weakref

from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import ContextLengthError, UserError
from serve_app.events import GenerateRequest
from serve_app.replica.media_inputs import MediaPolicy, load_media
from serve_app.replica.render import ends_in_thought, render

NO_FETCH = MediaPolicy()  # data: URLs only
_TEXTS: "weakref.WeakKeyDictionary[object, dict[int, str]]" = weakref.WeakKeyDictionary()


def prompt_ids(engine, req: GenerateRequest, add_generation_prompt: bool = True, add_special_tokens: bool = True,
               policy: MediaPolicy = NO_FETCH, encode: bool = True) -> tuple[list[int], bool, list]:
    """(the prompt's ids, whether it ends inside a thought channel, its media items encoded for the engine), as the
    engine sees them; `encode=False` expands the media placeholders without running the encoders (`/tokenize`)."""
    if req.kind == "chat":
        check_text_length(engine, sum(text_chars(m.get("content")) for m in req.messages), "messages")
        text = render(engine, list(req.messages), list(req.tools) or None,
                      add_generation_prompt=add_generation_prompt, **dict(req.template_kwargs))
        if req.media:
            ids, items = media_prompt(engine, text, req.media, policy, encode)
            return ids, ends_in_thought(text), items
        return engine.encode_rendered(text), ends_in_thought(text), []
    if isinstance(req.prompt, str):
        check_text_length(engine, len(req.prompt), "prompt")
        if not add_special_tokens:
            return engine.encode_rendered(req.prompt), False, []
        return engine.encode(req.prompt), False, []
    return list(req.prompt), False, []


def text_chars(content) -> int:
    if isinstance(content, list):
        return sum(len(item.get("text", "")) for item in content)
    return len(content or "")


def media_prompt(engine, text: str, parts, policy: MediaPolicy, encode: bool) -> tuple[list[int], list]:
    """The rendered chat's ids with each image / audio placeholder expanded by transformers' processor, and (with
    `encode`) the items encoded; a refusal names the part it is about (the whole `messages` when unclear)."""
    images, audios = load_media(parts, engine.media, policy)
    try:
        if encode:
            return engine.media.prepare(text, images, audios)
        return engine.media.expand(text, images, audios), []
    except UserError as e:
        if e.param:
            raise
        raise UserError(str(e), param=parts[0].param if len(parts) == 1 else "messages") from None


def tokenize(engine, req: GenerateRequest, add_generation_prompt: bool, add_special_tokens: bool,
             return_strs: bool, policy: MediaPolicy = NO_FETCH) -> dict:
    """`POST /tokenize`'s answer (the router adds `max_model_len`): an image or audio clip counts its soft tokens."""
    ids, _, _ = prompt_ids(engine, req, add_generation_prompt, add_special_tokens, policy, encode=False)
    out = {"count": len(ids), "tokens": ids}
    if return_strs and engine.tokenizer is not None:
        out["token_strs"] = engine.tokenizer.convert_ids_to_tokens(ids)
    return out


def detokenize(engine, ids: list[int]) -> dict:
    bad = [t for t in ids if not 0 <= t < engine.dims.vocab_size]
    if bad:
        raise UserError(f"token ids must be in [0, {engine.dims.vocab_size}); got {bad[:3]}", param="tokens")
    if engine.tokenizer is None:
        raise UserError("this model has no tokenizer", param="model")
    return {"prompt": engine.tokenizer.decode(ids, skip_special_tokens=False)}


def new_sequence(engine, req: GenerateRequest, policy: MediaPolicy = NO_FETCH):
    """Tokenize, decode and encode its media, and validate: (a sequence ready for `engine.add`, whether its prompt
    ends inside a thought channel). A UserError names the request field."""
    ids, in_thought, media = prompt_ids(engine, req, policy=policy)
    max_tokens = req.max_tokens or max(engine.max_context - len(ids), 1)
    sampling = {**engine.sampling_defaults, **dict(req.sampling)}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=req.ignore_eos, **sampling)
    opts = sequence_options(engine, req, in_thought)
    if media:
        opts["media"] = media
    return engine.new_sequence(ids, params, list(req.stop), **opts), in_thought


def check_text_length(engine, chars: int, param: str) -> None:
    """Refuse, without tokenizing it, a text that cannot fit: no token is longer than
    `max_token_chars`, so it has at least chars / max_token_chars tokens."""
    at_least = chars // max(engine.max_token_chars, 1)
    if at_least > engine.max_context:
        subject = "the messages have" if param == "messages" else f"the {param} has"
        raise ContextLengthError(f"this model's context is {engine.max_context} tokens; {subject} {chars} "
                                 f"characters, so at least {at_least} tokens", param=param)


def sequence_options(engine, req: GenerateRequest, in_thought: bool = False) -> dict:
    """Keyword arguments of `Engine.new_sequence` for this request (a prompt that ends inside a thought channel
    takes the grammar's variant that closes it first)."""
    opts: dict = {}
    grammar = req.grammar_in_thought if in_thought and req.grammar_in_thought else req.grammar
    if grammar is not None:
        opts["grammar"] = engine.grammars.compile(grammar, req.grammar_param or "response_format")
    if req.logprobs is not None:
        opts["logprobs"] = req.logprobs
    if req.prompt_logprobs is not None:
        opts["prompt_logprobs"] = req.prompt_logprobs
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


def prompt_entries(tokenizer, prompt_ids: list[int], scores: tuple) -> tuple[dict, ...]:
    """Each prompt token in the chat shape (`logprob_entry`), with its id and rank among the vocabulary: the
    engine's `TokenEvent.prompt_logprobs` (None for the first token) made wire-ready, token text included."""
    def one(t: int, lp: float) -> dict:
        s = token_text(tokenizer, t)
        return {"token": s, "id": t, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    out = []
    for t, score in zip(prompt_ids, scores):
        if score is None:
            out.append({**one(t, None), "rank": None, "top_logprobs": []})
            continue
        lp, top, rank = score
        out.append({**one(t, lp), "rank": rank, "top_logprobs": [{**one(i, v), "rank": r + 1}
                                                                  for r, (i, v) in enumerate(top)]})
    return tuple(out)
