"""What the `realvocab` tier's tests share: the real-vocabulary tokenizer directory (found through
$GEMMA4_REALVOCAB_DIR, default ~/.cache; prepared by `python -m neuron_workers.testing.real_vocab`, which .ci/run
calls), the module marks that skip the tier with the reason when it is absent, and one tiny 262,144-vocabulary
checkpoint and engine per session (written to a temporary folder: the chat template is always today's)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

from neuron_workers.testing.real_vocab import ENV, default_dir, is_ready

DIR = default_dir()
MARKS = [pytest.mark.realvocab, pytest.mark.slow,
         pytest.mark.skipif(not is_ready(DIR), reason=f"no real-vocabulary tokenizer at {DIR} (${ENV}): "
                            "`python -m neuron_workers.testing.real_vocab` builds it (needs npm and the registry)")]
CTX = 1024


@functools.cache
def tokenizer():
    from neuron_workers.testing.real_vocab import load_tokenizer

    return load_tokenizer(DIR)


@functools.cache
def checkpoint() -> Path:
    from neuron_workers.testing.real_vocab import write_real_vocab_checkpoint

    tmp = tempfile.mkdtemp(prefix="gemma4-realvocab-ckpt-")
    atexit.register(shutil.rmtree, tmp, True)
    return write_real_vocab_checkpoint(Path(tmp) / "gemma4-e2b-realvocab", DIR)


@functools.cache
def engine():
    from neuron_workers.config import EngineConfig
    from neuron_workers.factory import build_engine

    return build_engine(EngineConfig(model=str(checkpoint()), max_context=CTX, max_batch=4))
