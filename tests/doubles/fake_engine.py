"""TEST DOUBLE: the real Engine (scheduler, batching, sampling, stops) over a scripted backend that sleeps
`step_s` per graph call, with a character tokenizer. For server tests of streaming, cancellation,
back-pressure and pinning without loading a model. Selected per test through `ModelSpec.engine`."""

from __future__ import annotations

import time

import torch

from neuron_workers.engine.engine import Engine
from neuron_workers.model.dims import SLIDING
from neuron_workers.model.spec import make_spec

VOCAB, OFFSET = 64, 10


class CharTokenizer:
    """One id per character (offset by 10, wrapping in the vocabulary); decodes ids to letters."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [OFFSET + ord(c) % (VOCAB - OFFSET) for c in text]}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, tools=None, **kwargs):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<model>"

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + (i - OFFSET) % 26) for i in ids)

    def get_vocab(self):
        return {chr(i): i for i in range(VOCAB)}


class Dims:
    vocab_size, num_layers, ple_dim, sliding_window = VOCAB, 1, 0, 4
    final_logit_softcapping, kv_layers, layer_types = None, (), (SLIDING,)

    @staticmethod
    def ring_size(max_context):
        return min(4, max_context)


class Model:
    dims, ple, eos_token_ids = Dims, None, (1,)

    def __init__(self):
        self.tokenizer = CharTokenizer()
        self.info = type("Info", (), {"model_dir": "fake", "sampling_defaults": {"temperature": 0.0}})()


class SleepyBackend:
    """Every row's next token is a function of its last input token; each call sleeps step_s."""

    def __init__(self, max_context, max_batch, step_s):
        self.max_context, self.max_batch, self.buckets, self.step_s = max_context, max_batch, (max_context,), step_s

    def spec(self, phase, bucket=1):
        return make_spec(Dims, phase, self.max_batch, bucket, self.max_context)

    def _logits(self, last_tokens: torch.Tensor) -> torch.Tensor:
        time.sleep(self.step_s)
        z = torch.zeros(len(last_tokens), VOCAB)
        z[torch.arange(len(last_tokens)), OFFSET + (last_tokens * 7 + 3) % (VOCAB - OFFSET)] = 10.0
        return z

    def prefill(self, bucket, inputs):
        x = dict(zip((t.name for t in self.spec("prefill", bucket).host_inputs), inputs))
        last = int(x["last_idx"][0])
        return self._logits(x["input_ids"][0, last:last + 1])

    def decode(self, inputs):
        return self._logits(inputs[0][:, 0])

    def close(self):
        pass


def FakeEngine(spec):  # noqa: N802  (an engine factory, named like the class it stands in for)
    return Engine(Model(), SleepyBackend(spec.max_context or 256, spec.engine_config().batch,
                                         float(spec.engine_options.get("step_s", 0.01))))
