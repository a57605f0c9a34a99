"""Images and audio on the Neuron path, through the SDK double: `compile build` of a checkpoint that serves media
traces `mm_embeds` as the prefill and extend graphs' last input (a keyword) and records the soft-token ids in the
manifest; serving from those artifacts loads the encoders on the host and gives, for a prompt with an image and
an audio clip, the greedy tokens of the cpu engine in the same dtype (the media span through the chunks' extend
graph)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from compile.build import build
from neuron_workers.artifacts.manifest import Manifest
from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.factory import build_engine

from doubles import neuron_double

pytestmark = pytest.mark.slow
N = 6


def greedy(eng) -> list[int]:
    image = Image.fromarray(np.random.RandomState(5).randint(0, 255, (24, 20, 3), dtype=np.uint8))
    audio = (np.random.RandomState(6).randn(6000) * 0.1).astype(np.float32)
    ids, items = eng.media.prepare("<bos><|turn>user\nSee <|image|> hear <|audio|><turn|>\n<|turn>model\n",
                                   [image], [audio])
    seq = eng.new_sequence(ids, SamplingParams(max_tokens=N, ignore_eos=True), media=items)
    return [ev.token_id for ev in eng.run_all([seq]) if getattr(ev, "token_id", None) is not None]


def test_neuron_artifacts_serve_images_and_audio(tiny_dirs, tmp_path):
    d, out, chunk = tiny_dirs["gemma4-e2b-tiny"], tmp_path / "n", 16  # the media span crosses extend chunks
    with neuron_double.installed() as calls:
        m = build(EngineConfig(str(d), "neuron", 1, 256, (128, 256), "bfloat16", artifacts=str(out), max_batch=2,
                               prefill_chunk=chunk), progress=lambda _: None)
        traces = {c[1]: c[2] for c in calls if c[0] == "trace"}
        assert Manifest.read(out).media_ids == m.media_ids and m.media_ids
        for tag, inputs in traces.items():  # mm_embeds [rows, T, hidden] last on prefill / extend, never on decode
            takes = tag.startswith(("prefill", "extend"))
            assert (inputs[-1][0][-1] == 64 and len(inputs[-1][0]) == 3) == takes, (tag, inputs[-1])
        eng = build_engine(EngineConfig(str(d), "neuron", artifacts=str(out), max_context=256, max_batch=2,
                                        prefill_chunk=chunk))
        assert eng.media is not None and {"image", "audio"} <= eng.media.modalities
        got = greedy(eng)
        assert ("forward", "extend_1x16") in calls
    cpu = build_engine(EngineConfig(str(d), "cpu", max_context=256, max_batch=2, prefill_buckets=(128, 256),
                                    dtype="bfloat16", prefill_chunk=chunk))
    assert got == greedy(cpu) and len(got) == N
