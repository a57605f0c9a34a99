"""What a Neuron build makes, as the backend asks for it (`NeuronSpecs.graph_specs`): the prefill buckets, both
decodes and the extend shapes (`ExtendShape`: chunked prefill's `extend_1xT` / `_logits`, and a verify shape
`extend_BxT_all`; with an MTP drafter the candidate graphs' `_h` variants and the `draft` graph) with the tags and
flags of each; a manifest's extend list is checked against the graphs built; the Neuron double keeps each graph's
variant switches (`candidates`, `per_position`, `hidden`) as a compiled graph does, and computes gather as the device
does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neuron_workers.backends import neuron
from neuron_workers.errors import UserError
from neuron_workers.model.dims import ModelDims

from conftest import real_config
from doubles import neuron_double, neuron_double_units


@pytest.fixture(scope="module")
def e2b_specs():
    return neuron.NeuronSpecs(ModelDims.from_hf(real_config("E2B")), 4096, (128, 4096), 32, torch.bfloat16)


def test_graph_specs_are_the_buckets_the_decodes_then_the_extend_shapes(e2b_specs):
    specs = e2b_specs.graph_specs(neuron.chunk_shapes(256) + [neuron.ExtendShape(32, 8, neuron.ALL)])
    assert [s.tag for s in specs] == ["prefill_128", "prefill_4096", "decode_logits", "decode", "extend_1x256",
                                      "extend_1x256_logits", "extend_32x8_all"]
    last, logits, verify = specs[-3:]
    assert (last.rows, last.seq_len, last.candidates, last.per_position) == (1, 256, 256, False)
    assert logits.candidates == 0 and logits.outputs[0].shape == (1, 262144)
    assert verify.per_position and verify.outputs[0].shape == (32, 8, 256)
    assert all(t.dtype == torch.int32 for s in specs for t in s.host_inputs if t.name in ("input_ids", "slots"))
    flags = {s.tag: neuron.graph_flags(s) for s in specs}
    assert [next(x for x in f.split() if x in ("-O1", "-O2")) for f in flags.values()] == [
        "-O1", "-O1", "-O2", "-O2", "-O1", "-O1", "-O2"]
    assert neuron.chunk_shapes(0) == [] and e2b_specs.graph_specs()[-1].tag == "decode"
    as_kept = [1, 256, "logits"]  # how the manifest keeps a shape (JSON)
    assert neuron.ExtendShape(*as_kept) == neuron.ExtendShape(1, 256, neuron.LOGITS)
    with pytest.raises(ValueError, match="unknown extend variant 'every'"):
        neuron.ExtendShape(1, 8, "every").spec(e2b_specs)


def test_with_a_drafter_the_candidate_graphs_are_the_h_variants_and_draft_comes_last():
    """A build with an MTP drafter (`hidden_states`): `decode_h` and the `_h` top-K extends and mixed graph in place
    of the plain ones (the `_logits` graphs stay), then `draft` (-O2: latency bound, as decode), whose inputs are the
    host's draft inputs (the hidden state at the target's width) and whose outputs carry no KV. A drafter build's
    manifest whose mixed graphs are the plain ones (built before the `_h` variant) is refused, naming it."""
    specs = neuron.NeuronSpecs(ModelDims.from_hf(real_config("E2B")), 4096, (128,), 32, torch.bfloat16)
    specs.hidden_states = True
    shapes = neuron.chunk_shapes(256) + neuron.mixed_shapes(32, 256) + neuron.verify_shapes(32, 4)
    got = specs.graph_specs(shapes)
    assert [s.tag for s in got] == ["prefill_128", "decode_logits", "decode_h", "extend_1x256_h", "extend_1x256_logits",
                                    "mixed_32x256_h", "mixed_32x256_logits", "extend_32x5_all_h", "draft"]
    assert got[2].outputs[2].shape == (32, 1536) and got[7].outputs[2].shape == (32, 5, 1536)
    assert got[5].outputs[2].shape == (33, 1536)  # the B slots, then the chunk's last position
    built = {s.tag for s in got}
    assert neuron.check_extend(specs, built, shapes, [256]) == (256,)
    with pytest.raises(UserError, match=r"not built: \['mixed_32x256_h'\]"):
        neuron.check_extend(specs, built - {"mixed_32x256_h"} | {"mixed_32x256"}, shapes, [256])
    draft = got[-1]
    assert [(t.name, t.shape) for t in draft.host_inputs] == [
        ("input_ids", (32, 1)), ("hidden", (32, 1, 1536)), ("position_ids", (32, 1)), ("mask_full", (32, 1, 1, 4096)),
        ("mask_sliding", (32, 1, 1, 576))]
    assert draft.num_kv == 0 and draft.num_heads == 2 and " -O2 " in neuron.graph_flags(draft)


def test_artifacts_without_a_draft_graph_refuse_the_drafter_naming_the_field():
    backend = neuron.NeuronBackend.__new__(neuron.NeuronBackend)  # what a load of such artifacts leaves: the tags
    backend.graphs = {"prefill_128", "decode", "decode_logits"}
    for call in (lambda: backend.attach_drafter(None), lambda: backend.draft(())):
        with pytest.raises(UserError, match="no draft graph: rebuild them with `compile build --draft-model") as e:
            call()
        assert e.value.param == "draft_model"


def test_a_manifest_listing_extend_graphs_that_were_not_built_is_refused(e2b_specs):
    built = {"decode", "decode_logits", "extend_1x256", "extend_1x256_logits"}
    assert neuron.check_extend(e2b_specs, built, neuron.chunk_shapes(256), [256]) == (256,)
    assert neuron.check_extend(e2b_specs, built, [], []) == ()
    with pytest.raises(UserError, match=r"not built: \['extend_32x8_all'\]"):
        neuron.check_extend(e2b_specs, built, neuron.chunk_shapes(256) + [neuron.ExtendShape(32, 8, neuron.ALL)], [256])
    with pytest.raises(UserError, match=r"not built: \['256 \(logits\)'\]"):  # a chunk needs both its graphs
        neuron.check_extend(e2b_specs, built, [neuron.ExtendShape(1, 256, neuron.LAST)], [256])


class Variants(nn.Module):
    """One KV buffer; the head's shape depends on trace-time switches, as NeuronGraphModel's extend variants."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.register_buffer("k_0", torch.zeros(2, 4))
        self.kv_names, self.candidates, self.per_position = ["k_0"], 0, False

    def forward(self, x):
        self.k_0 = self.k_0 + x * self.w
        if not self.candidates:
            return self.k_0.sum(-1, keepdim=True)
        rows = self.k_0[:, None, : self.candidates].expand(2, 3, self.candidates)
        return rows if self.per_position else rows[:, -1]


def test_double_keeps_each_graphs_variant_switches():
    """Three graphs over the same inputs, told apart only by module switches set before each trace: each runs as
    traced whatever the module's switches are left at (a double that kept `candidates` alone would run
    `last` as `all` and refuse its shapes)."""
    with neuron_double.installed():
        module = Variants()
        builder = neuron_double.ModelBuilder(module)
        for tag, k, every in (("logits", 0, False), ("last", 2, False), ("all", 2, True)):
            module.candidates, module.per_position = k, every
            builder.trace(args=(torch.ones(4),), tag=tag)
        model = builder.compile(compiler_args="-O1", max_workers=1)
        model.set_weights([{"w": torch.ones(4)}])
        model.to_neuron()
        shapes = {tag: tuple(model.forward(torch.ones(4), model_name=tag).shape) for tag in ("all", "last", "logits")}
        assert shapes == {"all": (2, 3, 2), "last": (2, 2), "logits": (2, 1)}
        assert tuple(model.forward(torch.ones(4), model_name="last").shape) == (2, 2)


def test_double_gathers_an_expanded_int32_index_as_the_device_does():
    """The extend graph's padding write-back gathers with an int32 index expanded over each row; the double runs
    it on the CPU, and must give what an int64 (or contiguous) index gives there, only inside its forward."""
    flat = torch.arange(32 * 4, dtype=torch.float32).reshape(32, 4)
    rows = torch.tensor([16, 17, 18, 19, 20])
    want = torch.gather(flat, 0, rows.reshape(-1, 1).expand(5, 4))
    real = torch.gather
    with neuron_double_units.device_gather():
        got = torch.gather(flat, 0, rows.to(torch.int32).reshape(-1, 1).expand(5, 4))
    assert torch.equal(got, want) and got[:, 0].tolist() == [64.0, 68.0, 72.0, 76.0, 80.0]
    assert torch.gather is real
