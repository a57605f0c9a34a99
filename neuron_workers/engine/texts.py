"""The engine's text side (`Engine` inherits it): the prompt as the tokenizer and the chat template make it,
and what of the vocabulary never becomes text. Needs `self.tokenizer` (None: token ids only) and `self.model`."""

from __future__ import annotations

import functools

from neuron_workers.engine.detokenizer import unused_ids
from neuron_workers.errors import UserError


class Texts:
    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise UserError(f"{self.model.info.model_dir} has no tokenizer: pass token ids instead of text")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self._require_tokenizer()(text)["input_ids"])

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
                    **template_kwargs) -> str:
        """The chat template's prompt text; `tools` and the kwargs (e.g. `enable_thinking`) go to the template."""
        return self._require_tokenizer().apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                             add_generation_prompt=add_generation_prompt,
                                                             **template_kwargs)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
        return self.encode_rendered(self.render_chat(messages, tools, **template_kwargs))

    def encode_rendered(self, text: str) -> list[int]:
        """Ids of a rendered prompt (its control tokens and BOS are in the text)."""
        return list(self._require_tokenizer()(text, add_special_tokens=False)["input_ids"])

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The longest vocabulary entry in characters: a text of c characters has at least
        c / max_token_chars tokens, which lets a server refuse an absurd prompt without tokenizing it."""
        if self.tokenizer is None:
            return 1
        return max(len(t) for t in self.tokenizer.get_vocab())

    @functools.cached_property
    def unused_ids(self) -> frozenset[int]:
        """The reserved `<unusedN>` tokens: never text (`detokenizer.unused_ids`)."""
        return unused_ids(self.tokenizer) if self.tokenizer is not None else frozenset()
