"""The rules the real Neuron SDK enforces, checked without it:
- on the module the Neuron build traces (`NeuronGraphModel`), in every graph (prefill buckets, a bucket of
  1 included, both batched decodes, and the extend graphs: last-position candidates, logits, every position's
  candidates over several rows; the `_h` variants and the MTP draft graph), every KV buffer is read and replaced
  by a function of its old value (the draft graph's: the old value itself);
- the strict test double rejects each bad pattern the real SDK would (write-only state, weight names that
  differ from the traced ones, compile without a worker bound, inputs no graph was traced for), and keys
  weights as NxD does (`->` names, a Parameter tie is two device copies, read-only buffers are weights), so
  the contract tests mean something;
- the build reads NxD's `->` weight names, and fails with the names when a trace takes weights we would not
  save or state that is not KV;
- the module the build traces holds the tied embedding once, through the device move."""

from __future__ import annotations

import os
import types

import pytest
import torch
from torch import nn

from neuron_workers.backends.neuron import DENSE_GATHER_VAR, force_sparse_gathers
from neuron_workers.backends.neuron_build import check_traces
from neuron_workers.errors import UserError
from neuron_workers.model.graph_model import ID_DTYPE, draft_call, graph_model, make_buffers_persistent
from neuron_workers.model.loader import load_model
from neuron_workers.model.spec import DECODE, DRAFT, EXTEND, PREFILL, decode_candidates, make_spec

from conftest import NAMES
from doubles import neuron_double
from doubles.graph_facts import trace_facts


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_graph_reads_and_rewrites_every_kv_buffer(name, tiny_dirs, tmp_path):
    """... the `_h` variants and the draft graph of an MTP drafter included (the draft reads the store layers'
    buffers and returns every buffer unchanged: still read, replaced, from the old value, so linked as state)."""
    from neuron_workers.model.assistant import load_assistant
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    m = load_model(tiny_dirs[name], torch.bfloat16)
    make_buffers_persistent(m.hf_lm)
    module = graph_model(m.hf_lm, m.dims, 32, 3, torch.bfloat16)
    drafter = load_assistant(write_tiny_assistant(tiny_dirs[name], tmp_path / "drafter", seed=1), torch.bfloat16)
    make_buffers_persistent(drafter)
    module.attach(drafter)
    k = decode_candidates(m.dims)
    graphs = [(PREFILL, 1, 0, 0, False, False), (PREFILL, 16, 0, 0, False, False), (DECODE, 1, 0, 0, False, False),
              (DECODE, 1, 0, k, False, False), (EXTEND, 4, 3, k, True, False), (DRAFT, 1, 0, 0, False, False)]
    if name == "gemma4-e4b-tiny":  # the variants write the KV as the ones above: one structure (CI time)
        graphs += [(EXTEND, 8, 1, k, False, False), (EXTEND, 8, 1, 0, False, False), (DECODE, 1, 0, k, False, True),
                   (EXTEND, 4, 3, k, True, True)]
    for phase, bucket, rows, cand, every, hidden in graphs:
        spec = make_spec(m.dims, phase, 3, bucket, 32, torch.bfloat16, ID_DTYPE, None, cand, rows, every, hidden)
        # the variant, as the build sets it before a trace
        module.candidates, module.per_position, module.hidden = cand, every, hidden
        args, kwargs = tuple(t.zeros() for t in spec.host_inputs), {}
        if phase == DRAFT:
            args, kwargs = draft_call(args, bool(m.dims.ple_dim))
            draft = args, kwargs
        uses, weights = trace_facts(module, args, kwargs)
        if phase == DRAFT:  # the drafter's own weights, and the target's embedding (its input), each once
            assert {w for w in weights if w.startswith("drafter.")} and "lm.model.embed_tokens.weight" in weights
        assert set(uses) == set(module.kv_names) and len(uses) == 2 * len(m.dims.kv_layers)
        for buf, u in uses.items():
            assert u.read and u.written and u.from_old, (name, spec.tag, buf, u)
        assert not set(weights) & set(module.kv_names)
        assert set(weights) <= set(module.state_dict())  # after make_buffers_persistent: nothing unsaved
    assert len(set(module.draft_kv)) == 4  # k, v of the full and the sliding store layer
    before = {n: torch.randn_like(getattr(module, n)) for n in module.kv_names}
    for n, t in before.items():
        setattr(module, n, t)
    with torch.no_grad():
        module(*draft[0], **draft[1])  # the draft step itself: every KV buffer leaves as it came
    assert all(torch.equal(getattr(module, n), t) for n, t in before.items())


class Toy(nn.Module):
    """A one-buffer model whose update is chosen per test."""

    def __init__(self, update):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.register_buffer("k_0", torch.zeros(2, 4))
        self.kv_names, self.update = ["k_0"], update

    def forward(self, x):
        self.k_0 = self.update(self.k_0, x * self.w)
        return x.sum()


@pytest.mark.parametrize("update,ok", [
    (lambda old, new: torch.where(torch.tensor([[True], [False]]), new, old), True),  # read-modify-write
    (lambda old, new: torch.index_copy(old, 0, torch.tensor([0]), new[None]), True),
    (lambda old, new: new.expand(2, 4) * 1.0, False),  # write-only: the old value is never read
    (lambda old, new: torch.cat([new[None], new[None]]), False),  # a cat that drops the buffer
])
def test_double_rejects_write_only_state(update, ok):
    with neuron_double.installed():
        builder = neuron_double.ModelBuilder(Toy(update))
        if ok:
            builder.trace(args=(torch.ones(4),), tag="g")
            assert neuron_double.trace_facts is trace_facts
        else:
            with pytest.raises(neuron_double.DoubleRejects, match="without reading its old value"):
                builder.trace(args=(torch.ones(4),), tag="g")


def test_double_rejects_compile_without_workers_and_renamed_weights():
    with neuron_double.installed():
        builder = neuron_double.ModelBuilder(Toy(lambda old, new: old + new))
        builder.trace(args=(torch.ones(4),), tag="g")
        with pytest.raises(neuron_double.DoubleRejects, match="max_workers"):
            builder.compile(compiler_args={"g": "-O1"})
        model = builder.compile(compiler_args={"g": "-O1"}, max_workers=1)
        with pytest.raises(neuron_double.DoubleRejects, match="differ from the traced names"):
            model.set_weights([{"weight": torch.ones(4)}])
        model.set_weights([{"w": torch.full((4,), 2.0)}])
        model.to_neuron()
        assert float(model.forward(torch.ones(4), model_name="g")) == 4.0


def artifacts(weights, state):
    meta = types.SimpleNamespace(input_tensors=[types.SimpleNamespace(type="INPUT_STATE", checkpoint_key=s.encode())
                                                for s in state])
    return types.SimpleNamespace(weight_name_to_idx={w: i for i, w in enumerate(weights)}, metaneff=meta)


def test_build_check_names_what_does_not_match():
    kv = {"k_0", "v_0"}
    assert check_traces({"decode": artifacts(["a", "b"], kv)}, {"a", "b", "c"}, kv) == {"a", "b"}
    with pytest.raises(UserError, match=r"graph prefill_16 takes weights we would not save: \['rope.inv_freq'\]"):
        check_traces({"prefill_16": artifacts(["a", "rope->inv_freq"], kv)}, {"a"}, kv)
    with pytest.raises(UserError, match=r"its device state is not exactly the KV buffers \(missing \['v_0'\]"):
        check_traces({"decode": artifacts(["a"], {"k_0"})}, {"a"}, kv)


def test_build_check_reads_nxd_arrow_names_as_state_dict_keys():
    """weight_name_to_idx joins module names with '->' (NxD's own test: 'query->weight'); we save dotted keys."""
    kv = {"k_0", "v_0"}
    names = ["lm->model->layers->0->self_attn->q_proj->weight", "lm->model->embed_tokens->weight"]
    saved = {"lm.model.layers.0.self_attn.q_proj.weight", "lm.model.embed_tokens.weight"}
    assert check_traces({"decode": artifacts(names, kv)}, saved, kv) == saved


class Nested(nn.Module):
    """A tied head by Parameter (two modules, one Parameter), a read-only buffer, one KV buffer."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(8, 4), nn.Linear(4, 8, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.tensor(2.0))
        self.register_buffer("cache", torch.zeros(2, 4))
        self.kv_names = ["cache"]

    def forward(self, ids, slot):
        self.cache = torch.index_copy(self.cache, 0, slot, self.emb(ids)[:1])
        return self.head(self.cache * self.scale)


def test_double_keys_like_nxd_arrows_parameter_ties_and_read_only_buffers():
    with neuron_double.installed():
        builder = neuron_double.ModelBuilder(Nested())
        builder.trace(args=(torch.tensor([1, 2]), torch.tensor([0])), tag="two")
        art = builder.trace_artifacts_collection["two"]
    # a Parameter tie made before the move is two device copies; the read-only buffer is a weight, not state
    assert set(art.weight_name_to_idx) == {"emb->weight", "head->weight", "scale"}
    assert [t.checkpoint_key for t in art.metaneff.input_tensors] == [b"cache"]


def test_double_routes_by_input_names_and_shapes():
    with neuron_double.installed():
        builder = neuron_double.ModelBuilder(Nested())
        for n in (2, 3):
            builder.trace(args=(torch.arange(n), torch.tensor([0])), tag=f"n{n}")
        model = builder.compile(compiler_args={"n2": "", "n3": ""}, max_workers=1)
        m = Nested()
        model.set_weights([{"emb.weight": m.emb.weight, "head.weight": m.emb.weight, "scale": m.scale}])
        model.to_neuron()
        model.forward(torch.arange(3), torch.tensor([1]))  # routed by shape, no model_name needed
        assert neuron_double.CALLS[-1] == ("forward", "n3")
        with pytest.raises(neuron_double.DoubleRejects, match="no traced graph"):
            model.forward(torch.arange(4), torch.tensor([1]))
        with pytest.raises(neuron_double.DoubleRejects, match="does not take these inputs"):
            model.forward(torch.arange(3), torch.tensor([1]), model_name="n2")


@pytest.mark.slow
def test_the_traced_module_takes_the_tied_embedding_once(tiny_dirs):
    """tp=1: the LM head reads the embedding module (graph_model.TiedHead), so the trace (and the device)
    holds one vocab x hidden matrix; a Parameter tie would be two copies that compile plan does not count."""
    m = load_model(tiny_dirs["gemma4-e2b-tiny"], torch.bfloat16)
    make_buffers_persistent(m.hf_lm)
    module = graph_model(m.hf_lm, m.dims, 32, 2, torch.bfloat16)
    spec = make_spec(m.dims, DECODE, 2, 1, 32, torch.bfloat16, ID_DTYPE)
    with neuron_double.installed():
        force_sparse_gathers()  # as a build does before it traces
        builder = neuron_double.ModelBuilder(module)
        builder.trace(args=tuple(t.zeros() for t in spec.host_inputs), tag="decode")
    shapes = {k: v.shape for k, v in module.state_dict().items()}
    names = [n.replace("->", ".") for n in builder.trace_artifacts_collection["decode"].weight_name_to_idx]
    big = [n for n in names if shapes[n] == (m.dims.vocab_size, m.dims.hidden_size)]
    assert big == ["lm.model.embed_tokens.weight"]


def test_double_topk_refuses_what_the_sdk_refuses():
    """k over 16,384, a row wider than 8,192 and a negative dim are refused (the old `decode` graph's one
    TopK over the whole 262,144-wide row, with dim=-1, was all three but k); the tiled top-K passes."""
    from neuron_workers.backends.neuron_build import neuron_topk
    from neuron_workers.model.tiled_topk import tiled_topk

    g = torch.Generator().manual_seed(0)  # distinct values: a tie would let equal tops list their ids either way
    x = torch.randperm(2 * 262144, generator=g).reshape(2, 262144).float() / 4096
    with neuron_double.installed():
        TopK = neuron_double.TopK
        with pytest.raises(neuron_double.DoubleRejects, match="non-negative dim"):
            TopK.apply(x[:, :64], 4, dim=-1)
        with pytest.raises(neuron_double.DoubleRejects, match="k=16385"):
            TopK.apply(torch.randn(1, 20000), 16385, dim=1)
        with pytest.raises(neuron_double.DoubleRejects, match="row of 262144"):
            TopK.apply(x, 256, dim=1)  # what the decode graph ran before it was tiled
        with pytest.raises(ValueError, match="non-negative dim"):
            neuron_topk(x[:, :64], 4, -1)
        with pytest.raises(neuron_double.DoubleRejects, match="bfloat16"):
            TopK.apply(x[:, :64].bfloat16(), 4, dim=1)  # NxD Inference's TopK runs on fp32 only
        v, i = tiled_topk(x, 256, neuron_topk)
    want = torch.topk(x, 256)
    assert torch.equal(v, want.values) and torch.equal(i.long(), want.indices) and i.dtype == torch.int32


@pytest.mark.parametrize("width,tp", [(262144, 1), (262144, 2), (512, 1), (96, 1)])
def test_the_double_topk_sees_only_fp32_tiles_and_answers_as_torch_topk(width, tp):
    """bf16 logits [B, 262,144] (the decode shape, and a tp=2 rank's shard with its merge), the tiny width (two
    tiles) and a row narrower than two tiles of k (one untiled op): every TopK call the double sees is fp32 and at
    most 8,192 wide; the values equal torch.topk's (in bf16), the ids are int32 (the SDK's are u32) and name
    those values, and are torch.topk's ids wherever the value is not tied."""
    from neuron_workers.backends.neuron_build import neuron_topk
    from neuron_workers.model.tiled_topk import sharded_topk, tiled_topk

    from doubles import neuron_double_units as units

    g = torch.Generator().manual_seed(1)
    b, k = 4, min(256, width // 2)
    x = torch.randn(b, width, generator=g).bfloat16()
    with neuron_double.installed():
        if tp == 1:
            v, i = tiled_topk(x, k, neuron_topk)
        else:  # rank 0 of tp ranks; the all-gather concatenates every rank's candidates
            ranks = [tiled_topk(shard, k, neuron_topk) for shard in x.chunk(tp, dim=1)]
            gathered = {torch.int32: torch.cat([r[1] for r in ranks], 1), x.dtype: torch.cat([r[0] for r in ranks], 1)}
            v, i = sharded_topk(x.chunk(tp, dim=1)[0], k, lambda t: gathered[t.dtype], width, neuron_topk)
        calls = list(units.TOPK_CALLS)
    assert calls and all(dt == torch.float32 and shape[1] <= units.TOPK_MAX_ROW for dt, shape, _ in calls), calls
    want = torch.topk(x, k)
    assert i.dtype == torch.int32 and v.dtype == torch.bfloat16
    assert torch.equal(v, want.values)
    assert torch.equal(torch.gather(x, 1, i.long()), v) and all(len(set(r.tolist())) == k for r in i)
    untied = torch.cat([v[:, :-1] != v[:, 1:], torch.ones(b, 1, dtype=torch.bool)], 1) & torch.cat(
        [torch.ones(b, 1, dtype=torch.bool), v[:, 1:] != v[:, :-1]], 1) & (v != v[:, -1:])  # the K-th may tie out
    assert torch.equal(i.long()[untied], want.indices[untied])


class Shaped(nn.Module):
    """One KV buffer; the output's width is an attribute, so an eager run can differ from the traced graph."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.register_buffer("k_0", torch.zeros(2, 4))
        self.kv_names, self.width = ["k_0"], 4

    def forward(self, x):
        self.k_0 = self.k_0 + x * self.w
        return self.k_0[:, : self.width]


def test_double_refuses_weights_not_one_per_rank():
    for tp, given in ((2, 1), (1, 2)):
        with neuron_double.installed(), neuron_double.NxDParallelState(world_size=tp, tensor_model_parallel_size=tp):
            builder = neuron_double.ModelBuilder(Shaped())
            builder.trace(args=(torch.ones(4),), tag="g")
            model = builder.compile(compiler_args="-O1", max_workers=1)
            with pytest.raises(neuron_double.DoubleRejects, match=f"got {given} weight dicts for a world of {tp}"):
                model.set_weights([{"w": torch.ones(4)}] * given)
            model.set_weights([{"w": torch.ones(4)}] * tp)


def test_double_refuses_outputs_that_differ_from_the_traced_graph():
    with neuron_double.installed():
        module = Shaped()
        builder = neuron_double.ModelBuilder(module)
        builder.trace(args=(torch.ones(4),), tag="g")
        assert builder.trace_artifacts_collection["g"].heads == [(2, 4)]
        model = builder.compile(compiler_args="-O1", max_workers=1)
        model.set_weights([{"w": torch.ones(4)}])
        model.to_neuron()
        assert model.forward(torch.ones(4)).shape == (2, 4)
        module.width = 2  # the compiled graph would still return [2, 4]
        with pytest.raises(neuron_double.DoubleRejects, match=r"returned shapes \[\(2, 2\)\].*traced \[\(2, 4\)\]"):
            model.forward(torch.ones(4))


def test_the_plain_head_draft_argmax_runs_through_the_tiled_topk(tiny_dirs, tmp_path):
    """A drafter with the whole tied head (no centroids): in the graph model with the SDK's TopK (the double) its
    argmax is a tiled top-1 on fp32 tiles (no reduce over the whole row), and the drafts equal the plain argmax's."""
    from neuron_workers.backends.neuron_build import neuron_topk
    from neuron_workers.model.assistant import load_assistant
    from neuron_workers.model.draft_graph import DraftGraph, draft_masks
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    from doubles import neuron_double_units as units

    name = "gemma4-e4b-tiny"
    m = load_model(tiny_dirs[name])
    module = graph_model(m.hf_lm, m.dims, 32, 3, torch.float32)
    drafter = load_assistant(write_tiny_assistant(tiny_dirs[name], tmp_path / "plain", seed=2, ordered=False))
    module.attach(drafter)
    gen = torch.Generator().manual_seed(0)
    for n in module.kv_names:
        setattr(module, n, torch.randn(getattr(module, n).shape, generator=gen))
    q = torch.tensor([5, 11, 20])
    ids = torch.randint(0, m.dims.vocab_size, (3, 1), generator=gen, dtype=torch.int32)
    hidden = torch.randn(3, 1, m.dims.hidden_size, generator=gen)
    masks = draft_masks(q, 32, m.dims.ring_size(32), drafter.model.config.sliding_window, torch.float32)
    inputs = (ids, hidden, q[:, None].to(torch.int32), *masks)
    with neuron_double.installed(), torch.no_grad():
        module.use_topk(neuron_topk)
        args, kwargs = draft_call(inputs, bool(m.dims.ple_dim))
        drafts, _ = module(*args, **kwargs)
        calls = list(units.TOPK_CALLS)
    assert calls and all(dt == torch.float32 for dt, _, _ in calls) and {k for _, _, k in calls} == {1}
    plain = DraftGraph(drafter, m.hf_lm.model.embed_tokens, torch.int32)  # topk_op None: torch.argmax
    kv = [getattr(module, n) for n in module.draft_kv]
    with torch.no_grad():
        want, _ = plain(ids, hidden, q[:, None], *masks, *kv)
    assert torch.equal(drafts, want)


@pytest.mark.slow
def test_the_draft_state_fallback_rewrites_one_entry_and_keeps_every_buffer(tiny_dirs, tmp_path, monkeypatch):
    """GEMMA4_DRAFT_STATE=rmw (`compile smoke`'s `state` step's fallback): the draft graph writes one entry of every
    KV buffer with its own value, a real read-modify-write the trace links as state, and every buffer leaves as it
    came; the variable is checked at build."""
    from neuron_workers.backends.neuron_build import draft_state
    from neuron_workers.model.assistant import load_assistant
    from neuron_workers.model.draft_graph import draft_masks
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    name = "gemma4-12b-tiny"
    m = load_model(tiny_dirs[name])
    module = graph_model(m.hf_lm, m.dims, 32, 3, torch.float32)
    module.attach(load_assistant(write_tiny_assistant(tiny_dirs[name], tmp_path / "d", seed=1)))
    monkeypatch.setenv("GEMMA4_DRAFT_STATE", "rmw")
    module.draft_state = draft_state()
    gen = torch.Generator().manual_seed(0)
    before = {n: torch.randn(getattr(module, n).shape, generator=gen) for n in module.kv_names}
    for n, t in before.items():
        setattr(module, n, t)
    q = torch.tensor([5, 9, 3])
    masks = draft_masks(q, 32, m.dims.ring_size(32), 8, torch.float32)
    inputs = (torch.zeros(3, 1, dtype=torch.int32), torch.randn(3, 1, m.dims.hidden_size, generator=gen),
              q[:, None].to(torch.int32), *masks)
    args, kwargs = draft_call(inputs, bool(m.dims.ple_dim))
    uses, _ = trace_facts(module, args, kwargs)
    assert all(u.read and u.written and u.from_old for u in uses.values()), uses
    with torch.no_grad():
        module(*args, **kwargs)
    assert all(torch.equal(getattr(module, n), t) for n, t in before.items())
    monkeypatch.setenv("GEMMA4_DRAFT_STATE", "copy")
    with pytest.raises(UserError, match="GEMMA4_DRAFT_STATE"):
        draft_state()


class Gathers(nn.Module):
    """An element gather over a [rows, 4] table (rows = the gathered dim), e.g. the ring write-back's flat view:
    `torch.gather` by default, or `how` (take_along_dim, take: over the flattened table, index_select)."""

    kv_names: list = []

    def __init__(self, rows: int, how: str = "gather"):
        super().__init__()
        self.how = how
        self.register_buffer("table", torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4))

    def forward(self, idx):
        if self.how == "take_along_dim":
            return torch.take_along_dim(self.table, idx, 0)
        if self.how == "take":
            return torch.take(self.table, idx)
        if self.how == "index_select":
            return self.table.index_select(0, idx[:, 0])
        return torch.gather(self.table, 0, idx)


class NoGathers(nn.Module):
    kv_names: list = []

    def forward(self, x):
        return x * 2


IDX = torch.zeros(3, 4, dtype=torch.int64)


def trace(module, tag="g"):
    return neuron_double.ModelBuilder(module).trace(args=(IDX,), tag=tag).trace_artifacts_collection[tag]


def test_a_gather_at_real_width_is_refused_naming_the_tag_the_op_and_its_width():
    """18,432 rows (E2B's ring write-back at B = 32) is under 10 x 8,192: with XLA_DENSE_GATHER_FACTOR unset a
    Neuron device would lower the gather densely; the refusal names the graph, the op and the gathered dim."""
    with neuron_double.installed():
        assert "XLA_DENSE_GATHER_FACTOR" not in os.environ  # a fresh process's environment
        with pytest.raises(neuron_double.DoubleRejects, match=r"^ring: 1 element gather\(s\) would lower densely on a "
                           r"Neuron device \(aten.gather over 18,432 elements .* = 81,920\)"):
            trace(Gathers(18_432), "ring")
        with pytest.raises(neuron_double.DoubleRejects, match=r"aten.take_along_dim over 18,432 elements"):
            trace(Gathers(18_432, "take_along_dim"))
        with pytest.raises(neuron_double.DoubleRejects, match=r"aten.take over 73,728 elements"):  # 18,432 x 4
            trace(Gathers(18_432, "take"))
        with pytest.raises(neuron_double.DoubleRejects, match=r"aten.gather over 81,920 elements"):  # the bound
            trace(Gathers(81_920))


def test_what_torch_xla_lowers_sparsely_passes_with_the_factor_unset():
    """IsSparseGather compares the input's gathered dim only: past 10 x 8,192 rows a gather is sparse, and so is a
    take over more elements than that in all, whatever its index; index_select is a slice gather (never dense)."""
    with neuron_double.installed():
        assert trace(Gathers(81_921)).gathers == [("aten.gather", 81_921)]
        assert trace(Gathers(20_481, "take")).gathers == [("aten.take", 81_924)]  # 4 x 20,481 flattened
        assert trace(Gathers(18_432, "index_select")).gathers == []


def test_a_toy_module_without_gathers_passes_with_the_factor_unset():
    with neuron_double.installed():
        art = neuron_double.ModelBuilder(NoGathers()).trace(args=(torch.ones(4),), tag="plain")
        assert art.trace_artifacts_collection["plain"].gathers == []


def test_a_gather_at_real_width_passes_once_the_build_forced_sparse_gathers(monkeypatch):
    """`neuron.force_sparse_gathers` (every build calls it first) sets the factor to 0: every gather is sparse.
    A factor set otherwise moves the bound (10 x it); each installation starts with the variable unset again."""
    with neuron_double.installed():
        force_sparse_gathers()
        assert os.environ[DENSE_GATHER_VAR] == "0"
        assert trace(Gathers(18_432)).gathers == [("aten.gather", 18_432)]
        assert trace(Gathers(4, "take")).gathers == [("aten.take", 16)]
    with neuron_double.installed():
        assert DENSE_GATHER_VAR not in os.environ
        with pytest.raises(neuron_double.DoubleRejects, match="XLA_DENSE_GATHER_FACTOR=0"):
            trace(Gathers(18_432))
        monkeypatch.setenv(DENSE_GATHER_VAR, "1843")  # bound 18,430: 18,432 rows sparse, 18,430 dense
        trace(Gathers(18_432))
        with pytest.raises(neuron_double.DoubleRejects, match=r"aten.gather over 18,430 elements .* = 18,430\)"):
            trace(Gathers(18_430))


@pytest.mark.slow
def test_the_tiny_build_traces_gathers_at_real_width_only_through_force_sparse_gathers(tiny_dirs, tmp_path,
                                                                                          monkeypatch):
    """The real build path (compile.build -> require_neuron -> force_sparse_gathers) traces E2B-tiny's prefill,
    whose ring write-back gathers under 81,920 rows: it passes; the same build whose process never set the factor
    is refused at its first trace, naming it."""
    from compile.build import build
    from neuron_workers.backends import neuron
    from neuron_workers.config import EngineConfig

    def config(name):
        return EngineConfig(str(tiny_dirs["gemma4-e2b-tiny"]), "neuron", 1, 64, (16,), "bfloat16",
                            artifacts=str(tmp_path / name), max_batch=1)

    with neuron_double.installed():
        build(config("a"), progress=lambda _: None, jobs=1)
        prefill = neuron_double.SAVED[str(tmp_path / "a" / "nxd_model.pt")].traces["prefill_16"]
        assert prefill.gathers and all(op == "aten.gather" and n <= 81_920 for op, n in prefill.gathers)
    monkeypatch.setattr(neuron, "force_sparse_gathers", lambda: None)  # a build that skipped it
    with neuron_double.installed():
        with pytest.raises(neuron_double.DoubleRejects, match=r"^prefill_16: \d+ element gather\(s\)"):
            build(config("b"), progress=lambda _: None, jobs=1)
