"""An HLO audit of every graph the Neuron build traces, as torch-xla 2.9 lowers it (tier `-m xla`), for the
three tiny structures at batch 3 (bf16, as a neuron build):
- no f64 anywhere, and s64 only as the one-element prefill slot index (`index_copy` takes int64 only;
  neuronx-cc narrows int64 to int32);
- constants small: no weight baked in (every weight and KV buffer is a parameter), far from protobuf's 2 GB;
- decode writes one position per row into every KV buffer (a scatter of B x H x D elements) and never selects
  over a whole KV buffer; prefill writes one row (a scatter of one slot); an extend graph writes its R rows'
  T positions (a scatter of R x H x T x D elements into the buffer's [B*H*N, D] view);
- the tied embedding is one parameter, not two copies;
- with an MTP drafter: the `draft` graph writes no KV (every KV buffer a parameter returned as it came in: no
  scatter, no select) and sorts only the centroid scores; the `_h` candidate graphs write the KV as the plain ones;
- `python -m compile hlo` writes each graph's text and the audit (the op inventory) for the first inf2 run.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from compile.__main__ import main as compile_main
from compile.hlo import audit, dense_on_neuron, graph_hlos, kv_shapes
from neuron_workers.config import EngineConfig
from neuron_workers.factory import build_engine
from neuron_workers.model.tiled_topk import TILE_LIMIT, tile_width, tiled_topk

from conftest import NAMES

pytestmark = pytest.mark.xla
pytest.importorskip("torch_xla")

BATCH, CTX, BUCKETS = 3, 64, (16, 32)
MAX_CONSTANT_ELEMENTS = 4096  # the whole graph's literals; a baked weight or arange(max_context) breaks it


@pytest.fixture(scope="module", params=NAMES)
def graphs(request, tiny_dirs):
    eng = build_engine(EngineConfig(model=str(tiny_dirs[request.param]), backend="xla", max_context=CTX,
                                    prefill_buckets=BUCKETS, max_batch=BATCH, dtype="bfloat16", prefill_chunk=16))
    yield eng.backend, graph_hlos(eng.backend)
    eng.close()


def test_every_graph_passes_the_audit(graphs):
    backend, hlos = graphs
    shapes = kv_shapes(backend)
    t = backend.extend_buckets[0]  # chunked prefill's chunk (16: the tiny ring, window 8 + slack 8)
    extend = [f"extend_1x{t}", f"extend_1x{t}_logits", f"mixed_{BATCH}x{t}", f"mixed_{BATCH}x{t}_logits",
              f"extend_{BATCH}x8_all"]  # chunks (alone, and beside the decode rows); the verify shape
    assert list(hlos) == ["prefill_16", "prefill_32", "decode_logits", "decode", *extend]
    vocab, k = backend.dims.vocab_size, backend.candidates
    tile = tile_width(vocab, k)
    # rows whose top-K the graph takes: torch.topk's int64 indices of their tiles (2 tiles of K at the tiny
    # width, cast to int32 at once; a Neuron build takes torch-neuronx's TopK op)
    topk_rows = {"decode": BATCH, extend[0]: 1, extend[2]: BATCH + 1, extend[4]: BATCH * 8}
    for tag, text in hlos.items():
        a = audit(text, shapes)
        # prefill: the one-element slot index; the extend graphs index in int32 throughout
        s64_allowed = 2 * k * topk_rows[tag] if tag in topk_rows else int(tag.startswith("prefill"))
        assert "f64" not in a["wide"] and a["wide"].get("s64", 0) <= s64_allowed, (tag, a["wide"])
        assert a["constant_elements"] <= MAX_CONSTANT_ELEMENTS, (tag, a["largest_constants"])
        assert a["kv_parameters"] == len(shapes) and a["kv_selects"] == 0, tag
        # reads: the chunk graphs copy out their one row's slot of each buffer; decode and the verify graph over
        # every slot (`model.in_place`) none: they attend over the buffers where they lie
        one_row = tag.startswith("mixed") or tag.startswith("extend_1x")
        assert a["kv_slot_gathers"] == ([1] * len(shapes) if one_row else []), (tag, a["kv_slot_gathers"])
        assert dense_on_neuron(a["element_gathers"], 0) == 0  # the build's XLA_DENSE_GATHER_FACTOR=0
        # the tiled top-K: a sort per tile, then one over the tiles' candidates; no other graph sorts
        assert a["sort_widths"] == ([tile, vocab // tile * k] if tag in topk_rows else []), (tag, a["sort_widths"])
        b, h, _, d = zip(*shapes)
        if tag.startswith("decode"):  # one position per row: B x H x D elements into each buffer
            assert a["kv_scatter_update_elements"] == [bb * hh * dd for bb, hh, dd in zip(b, h, d)]
        elif tag.startswith("mixed"):  # one position of each of the B rows, then T positions of the chunk's row
            want = sorted(n * hh * dd for hh, dd in zip(h, d) for n in (BATCH, t))
            assert sorted(a["kv_scatter_update_elements"]) == want, tag
        elif tag.startswith("extend"):  # T positions of each of its R rows: R x H x T x D elements, nothing more
            rows, tt = (BATCH, 8) if tag.endswith("_all") else (1, t)
            want = sorted(rows * hh * tt * dd for hh, dd in zip(h, d))  # (HLO order is not the buffers' order)
            assert sorted(a["kv_scatter_update_elements"]) == want, tag
        else:  # one row (slot) of each buffer: the prompt (full) or the ring (sliding)
            assert a["kv_scatter_update_elements"] == [math.prod(s) // BATCH for s in shapes]


def test_the_tied_embedding_is_one_parameter(graphs):
    backend, hlos = graphs
    vocab, hidden = backend.module.lm.model.embed_tokens.weight.shape
    for tag, text in hlos.items():
        assert text.count(f"bf16[{vocab},{hidden}]{{1,0}} parameter(") == 1, tag


def test_the_old_whole_buffer_decode_write_fails_the_audit(graphs, monkeypatch):
    """The audit can fail: the decode write it replaced (torch.where over the whole buffer) is caught."""
    from neuron_workers.model import graphs as graph_code

    def where_update(self, k, v, layer_idx, *args, **kwargs):
        j = self.index[layer_idx]
        n = self.kv[j].shape[2]
        hot = (torch.arange(n, device=k.device)[None, :] == self.pos % n)[:, None, :, None]
        self.kv[j], self.kv[j + 1] = torch.where(hot, k, self.kv[j]), torch.where(hot, v, self.kv[j + 1])
        return self.kv[j], self.kv[j + 1]

    backend, _ = graphs
    monkeypatch.setattr(graph_code.DecodeKV, "update", where_update)
    spec = backend.spec("decode")
    a = audit(backend.hlo(spec, tuple(t.zeros() for t in spec.host_inputs)), kv_shapes(backend))
    assert a["kv_selects"] == len(kv_shapes(backend)) and a["kv_scatter_update_elements"] == []
    assert a["wide"].get("s64", 0) > 1  # torch.arange is int64


def test_compile_hlo_writes_each_graph_and_the_audit(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "hlo"
    assert compile_main(["hlo", "--model", str(tiny_dirs["gemma4-e2b-tiny"]), "--out", str(out), "--batch", "2",
                         "--max-context", "64", "--prefill-buckets", "32"]) == 0
    # extend_1x16: the prefix cache's extend graph (chunking is off at the tiny ring, reuse is on)
    assert sorted(p.name for p in out.iterdir()) == ["audit.json", "decode.hlo.txt", "decode_logits.hlo.txt",
                                                      "extend_1x16.hlo.txt", "extend_1x16_logits.hlo.txt",
                                                      "extend_2x8_all.hlo.txt", "mixed_2x16.hlo.txt",
                                                      "mixed_2x16_logits.hlo.txt", "prefill_32.hlo.txt"]
    report = json.loads((out / "audit.json").read_text())
    assert report["decode"]["kv_selects"] == 0 and report["decode"]["ops"]["scatter"] == 12
    assert (out / "decode.hlo.txt").read_text().startswith("HloModule ")
    assert "decode: " in capsys.readouterr().out


@pytest.mark.parametrize("batch", [1, 32])
def test_the_tiled_top_k_at_the_real_width_sorts_no_row_wider_than_the_tile(batch):
    """The `decode` graph's top-K at Gemma-4's 262,144-wide rows, as torch-xla lowers it: every sort is over
    at most TILE_LIMIT; the one torch.topk over the whole row it replaced fails this check."""
    import torch_xla

    x = torch.randn(batch, 262144).to(torch_xla.device())
    tiled = audit(torch_xla._XLAC._get_xla_tensors_hlo(list(tiled_topk(x, 256))), [])
    assert tiled["sort_widths"] == [TILE_LIMIT, TILE_LIMIT] and tiled["widest_sort"] <= TILE_LIMIT
    whole = audit(torch_xla._XLAC._get_xla_tensors_hlo(list(torch.topk(x, 256, dim=-1))), [])
    assert whole["widest_sort"] == 262144
    # the merge's id gather is over 32 x 256 = 8,192 candidates: dense on a Neuron device under torch-xla's default
    # factor (8,192: dims up to 81,920), sparse under the build's 0 (`neuron.force_sparse_gathers`)
    assert tiled["element_gathers"] == [TILE_LIMIT]
    assert dense_on_neuron(tiled["element_gathers"], 8192) == 1 and dense_on_neuron(tiled["element_gathers"], 0) == 0


def test_build_processes_lower_every_gather_sparsely(tiny_dirs, tmp_path, monkeypatch):
    """`compile hlo` (and build, smoke) set XLA_DENSE_GATHER_FACTOR=0 before torch_xla lowers a gather, and its
    audit counts no gather a Neuron device would lower densely; a process started with another factor is refused."""
    from neuron_workers.backends.neuron import force_sparse_gathers
    from neuron_workers.errors import UserError

    monkeypatch.delenv("XLA_DENSE_GATHER_FACTOR", raising=False)
    out = tmp_path / "hlo"
    assert compile_main(["hlo", "--model", str(tiny_dirs["gemma4-12b-tiny"]), "--out", str(out), "--batch", "2",
                         "--max-context", "64", "--prefill-buckets", "32"]) == 0
    import os

    assert os.environ["XLA_DENSE_GATHER_FACTOR"] == "0"
    report = json.loads((out / "audit.json").read_text())
    assert all(a["dense_on_neuron"] == 0 for a in report.values())
    assert any(dense_on_neuron(a["element_gathers"], 8192) for a in report.values())  # what the factor prevents
    monkeypatch.setenv("XLA_DENSE_GATHER_FACTOR", "8192")
    with pytest.raises(UserError, match="XLA_DENSE_GATHER_FACTOR=8192"):
        force_sparse_gathers()


def test_with_a_drafter_the_draft_graph_writes_no_kv_and_the_h_graphs_write_as_before(tiny_dirs, tmp_path):
    """E2B-like (PLE: the draft's placeholder input), batch 3, bf16, `compile hlo --draft-model`: `draft` takes every
    KV buffer and returns each untouched (a write or a whole-buffer select would fail this), with no 64-bit tensor
    wider than its rows' candidate ids and no sort wider than the centroids' tiles; `decode_h`, the mixed
    `mixed_3x16_h` and the verify `extend_3x8_all_h` write each KV buffer as `decode`, `mixed_3x16` and
    `extend_3x8_all` do, and return nothing unchanged."""
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    name = "gemma4-e2b-tiny"
    drafter = write_tiny_assistant(tiny_dirs[name], tmp_path / "drafter", seed=1)
    out = tmp_path / "hlo"
    assert compile_main(["hlo", "--model", str(tiny_dirs[name]), "--out", str(out), "--batch", str(BATCH),
                         "--max-context", str(CTX), "--prefill-buckets", "32", "--draft-model", str(drafter)]) == 0
    report = json.loads((out / "audit.json").read_text())
    assert list(report) == ["prefill_32", "decode_logits", "decode_h", "extend_1x16_h", "extend_1x16_logits",
                            "mixed_3x16_h", "mixed_3x16_logits", "extend_3x8_all_h", "draft"]
    eng = build_engine(EngineConfig(model=str(tiny_dirs[name]), backend="xla", max_context=CTX, prefill_buckets=(32,),
                                    max_batch=BATCH, dtype="bfloat16"))
    try:
        shapes = kv_shapes(eng.backend)
        plain = {s.tag: audit(eng.backend.hlo(s, tuple(t.zeros() for t in s.host_inputs)), shapes)
                 for s in (eng.backend.spec("decode", 1, eng.backend.candidates), eng.backend.mixed_spec(16),
                           eng.backend.extend_spec(8, BATCH, per_position=True))}
    finally:
        eng.close()
    draft = report["draft"]
    assert draft["kv_parameters"] == draft["kv_passed_through"] == len(shapes)
    assert draft["kv_scatter_update_elements"] == [] and draft["kv_selects"] == 0
    candidates = 4 * 512 // 16  # centroid_top_k clusters of vocab / num_centroids tokens
    assert "f64" not in draft["wide"] and draft["wide"].get("s64", 0) <= BATCH * candidates, draft["wide"]
    assert draft["widest_sort"] <= 16 and draft["constant_elements"] <= MAX_CONSTANT_ELEMENTS  # 16 centroids
    for tag, base in (("decode_h", "decode"), ("mixed_3x16_h", "mixed_3x16"), ("extend_3x8_all_h", "extend_3x8_all")):
        assert sorted(report[tag]["kv_scatter_update_elements"]) == sorted(plain[base]["kv_scatter_update_elements"])
        assert report[tag]["kv_passed_through"] == 0 and report[tag]["kv_selects"] == 0, tag
