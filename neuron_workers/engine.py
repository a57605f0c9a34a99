"""The engine: tokenize -> choose bucket -> prefill -> decode loop -> incremental detokenization.

`Engine.generate` is a generator of `TokenEvent`s, one per new token, so callers can stream and can
stop early (closing the generator stops decoding). The engine owns host-side work only (PLE lookup,
masks, sampling, stop rules, detokenization); the backend owns the graphs and the KV buffers. One
sequence at a time: callers serialize requests (the Ray Serve replica holds a lock).
"""

from __future__ import annotations

from typing import Iterator

from neuron_workers.detok import IncrementalDetokenizer
from neuron_workers.errors import ContextLengthError, UserError
from neuron_workers.host_inputs import DecodeInputs, choose_bucket, prefill_inputs
from neuron_workers.params import SamplingParams, TokenEvent
from neuron_workers.sampling import make_generator, sample
from neuron_workers.spec import DECODE, PREFILL


class Engine:
    def __init__(self, model, backend):
        self.model, self.backend = model, backend
        self.dims, self.tokenizer = model.dims, model.tokenizer
        self.max_context = backend.max_context
        self.decode_inputs = DecodeInputs(backend.spec(DECODE), model.ple)

    @property
    def sampling_defaults(self) -> dict:
        return dict(self.model.info.sampling_defaults)

    def close(self) -> None:
        self.backend.close()

    # --- prompts -------------------------------------------------------------------------------
    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise UserError(f"{self.model.info.model_dir} has no tokenizer: pass token ids instead of text")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self._require_tokenizer()(text)["input_ids"])

    def encode_chat(self, messages: list[dict]) -> list[int]:
        tok = self._require_tokenizer()
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer else ""

    def validate(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        """Raise a UserError unless the ids are in the vocabulary and prompt + new tokens fit the context."""
        self._check_ids(prompt_ids)
        self.check_fits(len(prompt_ids), max_new_tokens)

    def check_fits(self, n_prompt: int, max_new_tokens: int) -> None:
        if n_prompt < 1:
            raise UserError("the prompt is empty", param="prompt")
        if n_prompt + max_new_tokens > self.max_context:
            raise ContextLengthError(
                f"this model's context is {self.max_context} tokens; the prompt has {n_prompt} and "
                f"{max_new_tokens} new tokens were asked for ({n_prompt + max_new_tokens} in all)",
                param="max_tokens" if n_prompt < self.max_context else "prompt")

    # --- generation ----------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[TokenEvent]:
        self.validate(prompt_ids, params.max_new_tokens)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.model.eos_token_ids))
        gen = None if params.greedy else make_generator(params.seed)
        cap = self.dims.final_logit_softcapping
        detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None
        logits = self._prefill(prompt_ids)
        pos = len(prompt_ids)
        for i in range(params.max_new_tokens):
            token = sample(logits[0], params, cap, gen)
            finish = "stop" if token in stop_ids else ("length" if i + 1 == params.max_new_tokens else None)
            text = detok.push(token) if detok else ""
            if finish and detok:
                text += detok.flush()
            yield TokenEvent(token, text, finish)
            if finish:
                return
            logits = self.backend.decode(self.decode_inputs.step(token, pos))
            pos += 1

    def _prefill(self, ids: list[int]):
        bucket = choose_bucket(len(ids), self.backend.buckets)
        spec = self.backend.spec(PREFILL, bucket)
        logits = self.backend.prefill(bucket, prefill_inputs(spec, ids, self.model.ple, self.dims.sliding_window))
        self.decode_inputs.start(len(ids))
        return logits

    def _check_ids(self, ids: list[int]) -> None:
        vocab = self.dims.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise UserError(f"token ids must be integers in [0, {vocab}); got {bad[:3]}", param="prompt")
