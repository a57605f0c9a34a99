"""FakeEngine: a torch-free stand-in with the engine's interface, for server tests and load experiments.

It "tokenizes" by characters (one id per character, offset by 10), answers with a deterministic
sequence derived from the prompt, and sleeps `step_s` per token so streaming, cancellation and
back-pressure can be observed. Not a model: never configure it for users.
"""

from __future__ import annotations

import time

from neuron_workers.errors import ContextLengthError, UserError
from neuron_workers.params import SamplingParams, TokenEvent

OFFSET = 10
EOS = 1


class FakeEngine:
    def __init__(self, spec):
        opts = spec.engine_options
        self.max_context = spec.max_context or 256
        self.step_s = float(opts.get("step_s", 0.01))
        self.sampling_defaults = {"temperature": 0.0}
        self.tokenizer = self

    def encode(self, text: str) -> list[int]:
        return [OFFSET + (ord(c) % 100) for c in text]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<model>")

    def decode_text(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + (i - OFFSET) % 26) for i in ids)

    def validate(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        self.check_fits(len(prompt_ids), max_new_tokens)

    def check_fits(self, n_prompt: int, max_new_tokens: int) -> None:
        if n_prompt < 1:
            raise UserError("the prompt is empty", param="prompt")
        if n_prompt + max_new_tokens > self.max_context:
            raise ContextLengthError(f"this model's context is {self.max_context} tokens; the prompt has "
                                     f"{n_prompt} and {max_new_tokens} new tokens were asked for",
                                     param="max_tokens" if n_prompt < self.max_context else "prompt")

    def generate(self, prompt_ids: list[int], params: SamplingParams):
        self.check_fits(len(prompt_ids), params.max_new_tokens)
        base = sum(prompt_ids) + (params.seed or 0)
        for i in range(params.max_new_tokens):
            time.sleep(self.step_s)
            tok = OFFSET + (base + 7 * i) % 26
            last = i + 1 == params.max_new_tokens
            yield TokenEvent(tok, self.decode_text([tok]), "length" if last else None)

    def close(self) -> None:
        pass
