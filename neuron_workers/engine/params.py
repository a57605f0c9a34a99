"""SamplingParams: what one request asks of the sampler and the stop rules, penalties and logit bias included
(`engine/penalties.py` applies those). Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_workers.errors import UserError

GREEDY_BELOW = 1e-5
REPETITION_RANGE = (0.01, 100.0)  # transformers divides positive logits by it: 0 would be a division by zero
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's frequency_penalty and presence_penalty
BIAS_RANGE = (-100.0, 100.0)  # OpenAI's logit_bias values
MAX_LOGIT_BIAS = 1024  # entries per request


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0  # 0 -> off
    top_p: float = 1.0  # 1 -> off
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    repetition_penalty: float = 1.0  # 1 -> off; transformers' rule over prompt and output tokens
    frequency_penalty: float = 0.0  # OpenAI's: minus penalty x count, output tokens
    presence_penalty: float = 0.0  # OpenAI's: minus penalty once a token appeared in the output
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise UserError(f"max_tokens must be a positive integer, got {self.max_tokens!r}",
                            param="max_tokens")
        if not 0.0 <= self.temperature <= 2.0:
            raise UserError(f"temperature must be in [0, 2], got {self.temperature}", param="temperature")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0, got {self.top_k}", param="top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        _check_range("repetition_penalty", self.repetition_penalty, REPETITION_RANGE)
        _check_range("frequency_penalty", self.frequency_penalty, PENALTY_RANGE)
        _check_range("presence_penalty", self.presence_penalty, PENALTY_RANGE)
        _check_logit_bias(self.logit_bias)

    @property
    def penalized(self) -> bool:
        """Whether a penalty or a logit bias changes this request's logits (`penalties.Penalties`)."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or bool(self.logit_bias))

    @property
    def greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW are greedy (vLLM's rule): dividing fp32 logits by 1e-300 makes
        inf, then NaN probabilities, and an arbitrary token."""
        return self.temperature < GREEDY_BELOW


def _check_range(name: str, value: float, bounds: tuple[float, float]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not bounds[0] <= value <= bounds[1]:
        raise UserError(f"{name} must be a number in [{bounds[0]:g}, {bounds[1]:g}], got {value!r}", param=name)


def _check_logit_bias(pairs) -> None:
    if not isinstance(pairs, tuple) or not all(isinstance(x, tuple) and len(x) == 2 for x in pairs):
        raise UserError("logit_bias must be (token id, bias) pairs", param="logit_bias")
    if len(pairs) > MAX_LOGIT_BIAS:
        raise UserError(f"logit_bias takes at most {MAX_LOGIT_BIAS} entries, got {len(pairs)}", param="logit_bias")
    for token, bias in pairs:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise UserError(f"logit_bias keys must be token ids (non-negative integers), got {token!r}",
                            param="logit_bias")
        _check_range("logit_bias", bias, BIAS_RANGE)
    if len({token for token, _ in pairs}) < len(pairs):
        raise UserError("logit_bias names a token id twice", param="logit_bias")
