"""Per-row grammars for constrained decoding (llguidance).

`Grammars` (one per engine) owns the llguidance tokenizer, built lazily at the model's logits width
(`n_vocab`, so the mask covers every logit; ids past the tokenizer are never allowed) with the model's
EOS ids as the grammar's end tokens. `compile(grammar)` validates a grammar string against it and keeps a
prototype matcher, cached by the grammar text; it runs on the serving side's request thread, never the
engine thread (thread-safe). `RowGrammar` is one sequence's own matcher: `fill` writes its next-token mask into a
row of an int32 bitmask (llguidance's layout, `rows.Row.allowed`), `accept` advances it on every
token the engine keeps, `done` says only an end token could follow (the engine ends the row).

Limits (`parser_limits`, the router's checks use the same): a row of the Earley parser may hold up to
`MAX_ITEMS_IN_ROW` items (llguidance's default 2,000 refuses an object of ~500 optional properties at its
first key), and errors are short (llguidance's verbose errors dump the parser state and the grammar). A
grammar that still fails while it runs fails its own row with a `GrammarError` naming the request field
(`param`): the replica answers it as that field's error, never as a server error.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from neuron_workers.errors import UserError

if TYPE_CHECKING:  # no torch at import: the router reads the limits below
    import torch

CACHE = 64  # compiled grammars kept per engine
MAX_ITEMS_IN_ROW = 10_000  # 4 a property of an object with optional properties; masks stay at a few ms


def parser_limits():
    from llguidance import LLParserLimits

    return LLParserLimits(max_items_in_row=MAX_ITEMS_IN_ROW, verbose_errors=False)


def short(error: str) -> str:
    """llguidance's error without the parser state it may append."""
    return (error or "unknown error").strip().splitlines()[0].removeprefix("Parser Error: ")


class GrammarError(RuntimeError):
    """A row's grammar refused a token or failed mid-generation (that sequence alone fails), from the
    request field `param`."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class RowGrammar:
    def __init__(self, matcher, param: str | None = None, forget=None):
        self.m, self.param, self.forget = matcher, param, forget

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        import llguidance.torch as llt

        llt.fill_next_token_bitmask(self.m, bitmask, row)
        if self.m.is_error():
            error = short(self.m.get_error())
            if "panic" in error and self.forget is not None:  # a panic poisons what the copies share: recompile
                self.forget()
            raise GrammarError(f"the grammar from `{self.param}` failed: {error}", self.param)

    def accept(self, token: int) -> None:
        if not self.m.consume_token(token):
            raise GrammarError(f"the grammar from `{self.param}` refused token {token}: "
                               f"{short(self.m.get_error())}", self.param)

    @property
    def done(self) -> bool:
        return self.m.is_stopped()


class Grammars:
    def __init__(self, tokenizer, vocab_size: int, eos_ids):
        self.hf, self.vocab, self.eos = tokenizer, vocab_size, [t for t in eos_ids if t < vocab_size]
        self.lock = threading.Lock()
        self.cache: OrderedDict[str, object] = OrderedDict()
        self._tok = None

    @property
    def words(self) -> int:
        """int32 words per bitmask row."""
        return (self.vocab + 31) // 32

    def tokenizer(self):
        """The llguidance tokenizer (about 1 s to build at 262,144 tokens: once per engine)."""
        if self._tok is None:
            with self.lock:
                if self._tok is None:
                    import llguidance.hf

                    if self.hf is None:
                        raise UserError("this model has no tokenizer: constrained decoding needs one")
                    self._tok = llguidance.hf.from_tokenizer(self.hf, n_vocab=self.vocab,
                                                             eos_token=self.eos or None)
        return self._tok

    def compile(self, grammar: str, param: str = "response_format") -> RowGrammar:
        """A fresh matcher for `grammar`; a grammar the tokenizer cannot serve is a UserError naming `param`."""
        from llguidance import LLMatcher

        try:
            tok = self.tokenizer()
        except UserError:
            raise
        except Exception as e:  # a tokenizer llguidance cannot read: refuse the request, keep serving
            raise UserError(f"constrained decoding is not available for this model: {e}", param=param) from e
        with self.lock:
            proto = self.cache.get(grammar)
            if proto is not None:
                self.cache.move_to_end(grammar)
                return RowGrammar(proto.deep_copy(), param, lambda: self.forget(grammar))
        # never raises: a bad grammar is an error state
        proto = LLMatcher(tok, grammar, log_level=0, limits=parser_limits())
        if proto.is_error():
            raise UserError(f"the grammar cannot be used for constrained decoding: {short(proto.get_error())}",
                            param=param)
        with self.lock:
            self.cache[grammar] = proto
            while len(self.cache) > CACHE:
                self.cache.popitem(last=False)
        return RowGrammar(proto.deep_copy(), param, lambda: self.forget(grammar))

    def forget(self, grammar: str) -> None:
        with self.lock:
            self.cache.pop(grammar, None)
