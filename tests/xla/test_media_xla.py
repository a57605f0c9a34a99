"""Images and audio on the xla twin (tier `-m xla`): the module the Neuron build traces takes `mm_embeds` as one
more prefill / extend input (a keyword, after the phase inputs), and on an XLA CPU device its greedy tokens equal
the cpu backend's in fp32 for the E2B- and 12B-like structures (E4B's is E2B's): an image and an audio clip beside
a text-only row, whole prompts and chunked (the media span crossing chunks; the 12B's image blocks never cut);
each graph one program."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine

from conftest import NAMES

pytestmark = pytest.mark.xla
pytest.importorskip("torch_xla")

N = 6


def engine(path, backend: str, chunk: int | None):
    return build_engine(EngineConfig(model=str(path), backend=backend, max_context=256, prefill_buckets=(128, 256),
                                     max_batch=2, prefill_chunk=chunk))


def greedy(eng) -> list[list[int]]:
    """Two rows: a prompt with an image and an audio clip, and a text-only one beside it."""
    image = Image.fromarray(np.random.RandomState(3).randint(0, 255, (20, 28, 3), dtype=np.uint8))
    audio = (np.random.RandomState(4).randn(8000) * 0.1).astype(np.float32)
    ids, items = eng.media.prepare("<bos><|turn>user\nLook <|image|> and hear <|audio|><turn|>\n<|turn>model\n",
                                   [image], [audio])
    seqs = [eng.new_sequence(ids, SamplingParams(max_tokens=N, ignore_eos=True), media=items),
            eng.new_sequence([2] + [(5 * i) % 300 + 7 for i in range(30)], SamplingParams(max_tokens=N,
                                                                                           ignore_eos=True))]
    out = {s.seq_id: [] for s in seqs}
    for ev in eng.run_all(seqs):
        if getattr(ev, "token_id", None) is not None:
            out[ev.seq_id].append(ev.token_id)
    return [out[s.seq_id] for s in seqs]


@pytest.mark.parametrize("chunk", [0, 32], ids=["whole prompts", "chunked"])
@pytest.mark.parametrize("name", [n for n in NAMES if "e4b" not in n])  # E4B: E2B's structure, wider
def test_media_tokens_equal_the_cpu_backend(tiny_dirs, name, chunk):
    cpu, xla = engine(tiny_dirs[name], "cpu", chunk), engine(tiny_dirs[name], "xla", chunk)
    assert xla.media is not None and {"image", "audio"} <= xla.media.modalities
    if chunk and xla.media.bidirectional_images:  # the tiny 12B's chunk (its ring, 16) cannot hold an image block
        for eng in (cpu, xla):
            with pytest.raises(UserError, match="longer than this model's prefill chunk"):
                greedy(eng)
        return
    want, got = greedy(cpu), greedy(xla)
    assert got == want and all(len(t) == N for t in got)
    assert all(n <= 1 for n in xla.backend.compiles.values()), xla.backend.compiles
    assert any("mm" in tag or tag.startswith(("prefill", "extend")) for tag in xla.backend.compiles)
