"""compile build / plan. The Neuron path runs against a recording test double (tests/neuron_double.py):
what is checked is the contract of our calls, not Neuron itself. The cpu path runs for real."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file

from compile.__main__ import main as compile_main
from compile.build import build, extend_shapes
from neuron_workers.artifacts.manifest import Manifest
from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.generate import main as generate_main
from neuron_workers.model.loader import load_model

from conftest import inf2_config_copy
from doubles import neuron_double, neuron_double_units

KV = ("k_", "v_")
NO_SDK = pytest.mark.skipif(importlib.util.find_spec("torch_neuronx") is not None,
                            reason="checks the message shown without the Neuron SDK, which is installed here")


def kv_buffers(model):
    return {n: b for n, b in model.named_buffers() if n.startswith(KV)}


@pytest.mark.slow
def test_neuron_build_contract_tp1(tiny_dirs, tmp_path):
    said = []
    with neuron_double.installed() as calls:
        m = build(EngineConfig(str(tiny_dirs["gemma4-e2b-tiny"]), "neuron", 1, 64, (16, 32), "bfloat16",
                               artifacts=str(tmp_path / "a"), max_batch=3), progress=said.append, jobs=2)
        builder_model = neuron_double.SAVED[str(tmp_path / "a" / "nxd_model.pt")].module
    traces = [c for c in calls if c[0] == "trace"]
    # one call per bucket, then decode with logits and decode with top-K candidates (same inputs)
    assert [t[1] for t in traces] == ["prefill_16", "prefill_32", "decode_logits", "decode"]
    for _, tag, inputs, written in traces:
        dtypes = [d for _, d in inputs]
        if tag.startswith("decode"):  # ids, positions, per_layer_inputs, mask_full, mask_sliding: 3 rows
            assert dtypes == [torch.int32, torch.int32, torch.bfloat16, torch.bfloat16, torch.bfloat16]
            assert inputs[0][0] == (3, 1) and inputs[2][0] == (3, 1, 10, 8) and inputs[3][0] == (3, 1, 1, 64)
        else:  # one prompt, + last_idx, ring_idx, slot, then mm_embeds (the checkpoint serves images and audio)
            s = int(tag.split("_")[1])
            assert dtypes == [torch.int32, torch.int32] + [torch.bfloat16] * 3 + [torch.int32] * 3 + [torch.bfloat16]
            assert inputs[0][0] == (1, s) and inputs[2][0] == (1, s, 10, 8) and inputs[-1][0] == (1, s, 64)
        assert all(written.values())  # every KV buffer replaced (the double checked each read its old value)
    # the riskiest graph first and alone, then the rest (2 at a time); the model holds them in trace order
    assert [t for t, _ in neuron_double_units.COMPILED][0] == "decode"
    flags = dict(neuron_double_units.COMPILED)
    assert set(flags) == {"prefill_16", "prefill_32", "decode_logits", "decode"}
    assert any("decode first and alone, then 2 at a time" in line for line in said)
    assert [c[1] for c in calls if c[0] == "add"] == [t[1] for t in traces]
    for tag, f in flags.items():
        for flag in ("--model-type=transformer", "--auto-cast=none", "--target inf2"):
            assert flag in f
        assert ("-O1" in f) == tag.startswith("prefill") and ("-O2" in f) == tag.startswith("decode")
    dims = load_model(tiny_dirs["gemma4-e2b-tiny"], with_weights=False).dims
    bufs = kv_buffers(builder_model)
    assert len(bufs) == 2 * len(dims.kv_layers) and all(b.dtype == torch.bfloat16 for b in bufs.values())
    ring = dims.ring_size(64)  # the window (8) plus its slack (dims.RING_SLACK, at most the window)
    assert {b.shape[2] for b in bufs.values()} == {64, ring} and {b.shape[0] for b in bufs.values()} == {3}
    assert all(p.dtype == torch.bfloat16 for p in builder_model.parameters() if p.is_floating_point())
    assert m.backend == "neuron" and m.compiler_flags == flags and m.max_batch == 3
    assert m.media_ids == list(load_model(tiny_dirs["gemma4-e2b-tiny"], with_weights=False).soft_ids)
    saved = load_file(str(tmp_path / "a" / "weights" / "tp0.safetensors"))
    assert "lm.model.rotary_emb.full_attention_inv_freq" in saved  # non-persistent buffers the trace reads
    tied = [k for k in ("lm.lm_head.weight", "lm.model.embed_tokens.weight") if k in saved]
    assert tied and all(torch.equal(saved[k], saved[tied[0]]) for k in tied)  # the names the trace took
    assert ("save", str(tmp_path / "a" / "nxd_model.pt")) in calls


@pytest.mark.slow
@pytest.mark.parametrize("name,heads", [("gemma4-12b-tiny", {16: 1, 64: 1}), ("gemma4-e4b-tiny", {16: 1, 64: 1})])
def test_neuron_build_contract_tp2(tiny_dirs, tmp_path, name, heads):
    out = tmp_path / "b"
    with neuron_double.installed() as calls:
        build(EngineConfig(str(tiny_dirs[name]), "neuron", 2, 64, (32,), "bfloat16", artifacts=str(out), max_batch=2),
              progress=lambda s: None)
        model = neuron_double.SAVED[str(out / "nxd_model.pt")].module
    assert ("parallel_state", 2, 2) in calls
    for b in kv_buffers(model).values():
        assert b.shape[1] == heads[b.shape[2]]  # per-rank KV heads (rings: window 8 + slack 8): split or replicated
    w = [load_file(str(out / "weights" / f"tp{r}.safetensors")) for r in range(2)]
    shapes = dict(model.state_dict())
    assert set(w[0]) == set(w[1]) and all(w[r][k].shape == shapes[k].shape for r in range(2) for k in w[0])
    assert int(w[0]["lm.model.embed_tokens.vocab_start"]) == 0 and int(w[1]["lm.model.embed_tokens.vocab_start"]) == 256
    q = "lm.model.layers.0.self_attn.q_proj.weight"
    norm = "lm.model.layers.0.input_layernorm.weight"
    assert not torch.equal(w[0][q], w[1][q]) and torch.equal(w[0][norm], w[1][norm])
    full = load_model(tiny_dirs[name], torch.bfloat16).hf_lm.state_dict()
    assert torch.equal(torch.cat([w[0][q], w[1][q]]), full["model.layers.0.self_attn.q_proj.weight"])


@pytest.mark.slow
def test_neuron_build_with_an_mtp_drafter_at_tp2_splits_its_layers_and_traces_the_draft_graph(tiny_dirs, tmp_path):
    """E4B-like at tp=2 with a tiny drafter: the draft graph is traced under the tp=2 state like the rest (its
    state exactly the rank's KV buffers); per rank, the drafter's query / MLP weights are its halves (query heads
    split as the K/V they read) and its embedding, head and projections whole, as the cpu backend's tp=2 drafter."""
    from neuron_workers.model.assistant import load_assistant
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    d, out = tiny_dirs["gemma4-e4b-tiny"], tmp_path / "m"
    drafter = write_tiny_assistant(d, tmp_path / "drafter", seed=1)
    with neuron_double.installed() as calls:
        build(EngineConfig(str(d), "neuron", 2, 64, (32,), "bfloat16", artifacts=str(out), max_batch=2,
                           prefill_chunk=0, draft_model=str(drafter), num_speculative_tokens=3),
              progress=lambda s: None)
    assert ("parallel_state", 2, 2) in calls and [c[1] for c in calls if c[0] == "trace"][-1] == "draft"
    assert Manifest.read(out).drafter["name"] == "drafter"
    w = [load_file(str(out / "weights" / f"tp{r}.safetensors")) for r in range(2)]
    whole = load_assistant(drafter, torch.bfloat16).state_dict()
    assert set(w[0]) == set(w[1])
    for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight"):
        a, b = w[0][f"drafter.{key}"], w[1][f"drafter.{key}"]
        assert a.shape[0] * 2 == whole[key].shape[0] and torch.equal(torch.cat([a, b]), whole[key])
    down = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(torch.cat([w[0][f"drafter.{down}"], w[1][f"drafter.{down}"]], dim=1), whole[down])
    for key in ("pre_projection.weight", "model.embed_tokens.weight"):
        assert torch.equal(w[0][f"drafter.{key}"], whole[key]) and torch.equal(w[1][f"drafter.{key}"], whole[key])
    order = w[1]["drafter.masked_embedding.token_ordering"]
    assert order.dtype == torch.int32 and torch.equal(order.long(), whole["masked_embedding.token_ordering"])


@pytest.mark.slow
def test_neuron_pipeline_end_to_end_with_the_double(tiny_dirs, tmp_path, capsys):
    """build -> manifest -> NeuronBackend load/warm-up/forward (the double runs the traced module on CPU)
    gives the tokens of the CPU engine in the same dtype, for two prompts decoded together."""
    d, out = tiny_dirs["gemma4-e4b-tiny"], tmp_path / "c"
    args = ["--model", str(d), "--prompt-ids", "2,40,41,42,43,44,45,46,47,48,49", "--prompt-ids", "2,7,8",
            "--max-tokens", "24", "--ignore-eos", "--json", "--max-context", "64", "--max-batch", "2"]
    with neuron_double.installed() as calls:
        assert compile_main(["build", "--model", str(d), "--tp", "1", "--max-context", "64", "--prefill-buckets",
                             "16,32", "--batch", "2", "--out", str(out)]) == 0
        assert generate_main(args + ["--backend", "neuron", "--artifacts", str(out)]) == 0
        neuron = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()[-2:]]
        assert generate_main(args[:-2] + ["--max-batch", "3", "--backend", "neuron", "--artifacts", str(out)]) == 2
        assert "max_batch=2" in capsys.readouterr().err  # built for 2 rows: refuses to serve 3
    assert ("to_neuron",) in calls and ("forward", "decode") in calls
    assert generate_main(args + ["--dtype", "bfloat16"]) == 0
    cpu = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["token_ids"] for r in neuron] == [r["token_ids"] for r in cpu] and len(cpu[0]["token_ids"]) == 24


@NO_SDK
def test_neuron_without_sdk_says_what_to_install(tiny_dirs, tmp_path, capsys):
    rc = compile_main(["build", "--model", str(tiny_dirs["gemma4-e2b-tiny"]), "--out", str(tmp_path / "n")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "torch-neuronx" in err and "pip install" in err
    assert not (tmp_path / "n").exists()


@pytest.mark.slow
def test_cpu_build_load_generate_and_manifest_checks(tiny_dirs, tmp_path, capsys):
    d, out = tiny_dirs["gemma4-e2b-tiny"], tmp_path / "cpu"
    assert compile_main(["build", "--model", str(d), "--backend", "cpu", "--max-context", "64",
                         "--prefill-buckets", "32", "--out", str(out)]) == 0
    progress = capsys.readouterr().out
    assert "[1/3] exporting prefill_32" in progress and "[2/3] decode_logits done" in progress
    assert "[3/3] decode done" in progress
    m = Manifest.read(out)
    assert (m.tp, m.max_batch, m.max_context, m.prefill_buckets, m.dtype) == (1, 1, 64, [32], "float32")
    from importlib import metadata

    assert m.versions == {"torch": metadata.version("torch"), "transformers": metadata.version("transformers")}
    args = ["--prompt-ids", "2,5,6,7,8,9,10,11,12,13,14,15", "--max-tokens", "40", "--ignore-eos", "--json"]
    assert generate_main(["--model", str(d), "--artifacts", str(out)] + args) == 0
    from_artifacts = json.loads(capsys.readouterr().out)["token_ids"]
    assert generate_main(["--model", str(d), "--max-context", "64"] + args) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == from_artifacts
    # mismatches are refused with the field named
    assert generate_main(["--model", str(tiny_dirs["gemma4-e4b-tiny"]), "--artifacts", str(out)] + args) == 2
    assert "another model config" in capsys.readouterr().err
    assert generate_main(["--model", str(d), "--artifacts", str(out), "--max-context", "128"] + args) == 2
    assert "max_context=64" in capsys.readouterr().err
    raw = json.loads((out / "manifest.json").read_text())
    raw["versions"]["transformers"] = "4.0.0"
    (out / "manifest.json").write_text(json.dumps(raw))
    assert generate_main(["--model", str(d), "--artifacts", str(out)] + args) == 2
    assert "built with transformers 4.0.0" in capsys.readouterr().err


@pytest.mark.slow
def test_build_from_the_serve_config_builds_what_it_serves(tiny_dirs, tmp_path, capsys):
    """`compile build --config` takes tp, context, buckets, batch, dtype and the artifact directory from
    the serve YAML; serving that entry then finds exactly those artifacts."""
    def small(m):
        if m["name"] == "gemma-4-e2b":
            m.update(path=str(tiny_dirs["gemma4-e2b-tiny"]), max_context=64, prefill_buckets=[16, 32], max_batch=3,
                     artifacts=str(tmp_path / "art-e2b"))

    path, _ = inf2_config_copy(tmp_path, small)
    with neuron_double.installed() as calls:
        assert compile_main(["build", "--config", str(path), "--model", "gemma-4-e2b", "--jobs", "2"]) == 0
    m = Manifest.read(tmp_path / "art-e2b")
    assert (m.backend, m.tp, m.max_batch, m.max_context, m.prefill_buckets, m.dtype) == (
        "neuron", 1, 3, 64, [16, 32], "bfloat16")
    out = capsys.readouterr().out
    assert "== gemma-4-e2b" in out and "then 2 at a time" in out
    assert [c for c in calls if c[0] == "parallel_state"] == [("parallel_state", 1, 1)]


@NO_SDK
def test_smoke_without_the_sdk_says_what_to_install(capsys):
    assert compile_main(["smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "neuronx-distributed 0.19.28492" in err


@pytest.mark.slow
def test_neuron_build_with_a_chunk_traces_loads_and_runs_the_extend_graphs(tiny_dirs, tmp_path, capsys):
    """--prefill-chunk 16 (the tiny ring): the build traces `extend_1x16` and `extend_1x16_logits`, then the mixed
    graphs `mixed_2x16` and `mixed_2x16_logits` (2 decode tokens + the chunk on one axis), after the decode graphs
    from the same module (their KV read and rewritten), compiles them after the decodes, and the manifest lists
    them; loading sets the backend's extend_buckets and mixed steps, the engine prefills in chunks through them and
    gets the CPU engine's tokens; an extend graph that was not built is refused by name; a manifest written before
    the mixed graphs loads without mixed steps, one written before extend graphs with none."""
    from neuron_workers.artifacts.load import load_from_artifacts

    d, out = tiny_dirs["gemma4-e2b-tiny"], tmp_path / "x"
    with neuron_double.installed() as calls:
        assert compile_main(["build", "--model", str(d), "--max-context", "64", "--prefill-buckets", "16,32",
                             "--batch", "2", "--prefill-chunk", "16", "--out", str(out)]) == 0
        traces = {c[1]: c for c in calls if c[0] == "trace"}
        assert list(traces) == ["prefill_16", "prefill_32", "decode_logits", "decode", "extend_1x16",
                                "extend_1x16_logits", "mixed_2x16", "mixed_2x16_logits"]
        for tag in ("extend_1x16", "extend_1x16_logits"):
            _, _, inputs, written = traces[tag]
            assert [s for s, _ in inputs] == [(1, 16), (1, 16), (1, 16, 10, 8), (1, 1, 16, 64), (1, 1, 16, 32), (1,),
                                              (1,), (1, 16, 64)]
            # ids, positions, PLE, masks (ring 16 + the chunk), last_idx, slots, mm_embeds (a media checkpoint)
            assert [t for _, t in inputs] == [torch.int32] * 2 + [torch.bfloat16] * 3 + [torch.int32] * 2 + \
                [torch.bfloat16]
            assert written and all(written.values())
        for tag in ("mixed_2x16", "mixed_2x16_logits"):  # the extend inputs over 2 + 16 tokens of one row
            _, _, inputs, written = traces[tag]
            assert [s for s, _ in inputs] == [(1, 18), (1, 18), (1, 18, 10, 8), (1, 1, 18, 64), (1, 1, 18, 32), (1,),
                                              (1,)]
            assert written and all(written.values())
        # decode first and alone, then (one job: in order) the other decode, the extend and mixed graphs (largest
        # rows x T first), the buckets
        assert [t for t, _ in neuron_double_units.COMPILED] == ["decode", "decode_logits", "mixed_2x16",
                                                                "mixed_2x16_logits", "extend_1x16",
                                                                "extend_1x16_logits", "prefill_32", "prefill_16"]
        m = Manifest.read(out)
        assert m.extend_graphs == [[1, 16, "last"], [1, 16, "logits"], [2, 16, "mixed"], [2, 16, "mixed_logits"]]
        assert m.extend_buckets == [16] and "-O1" in m.compiler_flags["mixed_2x16"]
        assert {"extend_1x16", "extend_1x16_logits"} <= set(m.graphs)
        assert "-O1" in m.compiler_flags["extend_1x16"] and "-O1" in m.compiler_flags["extend_1x16_logits"]
        assert "+ extend 1x16 (prefill_chunk)" in capsys.readouterr().out

        cfg = EngineConfig(model=str(d), backend="neuron", artifacts=str(out))
        calls.clear()
        _, backend = load_from_artifacts(cfg)
        assert backend.extend_buckets == (16,) and backend.mixed_steps
        assert {c[1] for c in calls if c[0] == "forward"} >= {"extend_1x16", "extend_1x16_logits", "mixed_2x16",
                                                               "mixed_2x16_logits"}  # warmed up
        spec = backend.extend_spec(8, 1)
        with pytest.raises(RuntimeError, match="no graph extend_1x8 .*--prefill-chunk 8"):
            backend.extend(spec, tuple(t.zeros() for t in spec.host_inputs))
        with pytest.raises(UserError, match="prefill_chunk \\[16\\], this request asks for 8"):
            load_from_artifacts(EngineConfig(model=str(d), backend="neuron", artifacts=str(out), prefill_chunk=8))

        args = ["--model", str(d), "--prompt-ids", ",".join(map(str, [2] + list(range(40, 63)))),
                "--max-tokens", "12", "--ignore-eos", "--json"]
        calls.clear()
        assert generate_main(args + ["--backend", "neuron", "--artifacts", str(out)]) == 0
        neuron = json.loads(capsys.readouterr().out)["token_ids"]
        assert ("forward", "extend_1x16") in calls  # a 24-token prompt: 16 + 8 through the extend graph

        raw = json.loads((out / "manifest.json").read_text())
        raw["extend_graphs"] = raw["extend_graphs"][:2]
        (out / "manifest.json").write_text(json.dumps(raw))  # as written before the mixed graphs
        _, backend = load_from_artifacts(cfg)
        assert backend.extend_buckets == (16,) and not backend.mixed_steps
        for key in ("extend_graphs", "extend_buckets"):
            del raw[key]
        (out / "manifest.json").write_text(json.dumps(raw))  # as written before extend graphs
        calls.clear()
        _, backend = load_from_artifacts(cfg)
        assert backend.extend_buckets == () and not any(c[1].startswith("extend") for c in calls if c[0] == "forward")
    assert generate_main(args + ["--max-context", "64", "--dtype", "bfloat16", "--prefill-chunk", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == neuron and len(neuron) == 12


def test_neuron_extend_shapes_keep_the_mixed_graphs_beside_drafts():
    """The mixed graphs are built with every chunk size, beside drafts too (a chunk step runs them instead of a
    verify; beside an MTP drafter the build traces their `_h` variants: `test_smoke`)."""
    chunk, mixed = [(1, 16, "last"), (1, 16, "logits")], [(2, 16, "mixed"), (2, 16, "mixed_logits")]
    verify = [(2, 4, "all")]
    assert list(map(tuple, extend_shapes(2, 16, 0))) == chunk + mixed
    assert list(map(tuple, extend_shapes(2, 16, 3))) == chunk + mixed + verify
    assert list(map(tuple, extend_shapes(2, 0, 3))) == verify


def test_neuron_build_with_an_mtp_drafter_traces_and_serves_the_draft_and_verify_graphs(tiny_dirs, tmp_path, capsys):
    """--num-speculative-tokens 3 --draft-model D: the build traces the `_h` candidate graphs (`decode_h`, and the
    verify graph `extend_2x4_all_h`: every slot, 4 positions, every position's candidates and hidden state; -O2 like
    decode) and the `draft` graph last, from the same module (its state exactly the KV buffers, returned unchanged;
    its hidden state a keyword input), with the drafter's weights saved beside the target's; the manifest records
    the drafter. Served with that drafter (MTP drafts through the draft graph) and with ngram drafts, greedy tokens
    equal the plain CPU engine's; 2 drafts (no such verify graph) and another drafter are refused at load, naming
    the field."""
    from neuron_workers.artifacts.load import load_from_artifacts
    from neuron_workers.factory import build_engine
    from neuron_workers.testing.tiny_assistant import write_tiny_assistant

    d, out = tiny_dirs["gemma4-e2b-tiny"], tmp_path / "v"
    drafter = write_tiny_assistant(d, tmp_path / "drafter", seed=1)
    with neuron_double.installed() as calls:
        assert compile_main(["build", "--model", str(d), "--max-context", "64", "--prefill-buckets", "32",
                             "--batch", "2", "--prefill-chunk", "0", "--num-speculative-tokens", "3",
                             "--draft-model", str(drafter), "--out", str(out)]) == 0
        traces = {c[1]: c for c in calls if c[0] == "trace"}
        assert list(traces) == ["prefill_32", "decode_logits", "decode_h", "extend_2x4_all_h", "draft"]
        _, _, inputs, written = traces["draft"]  # ids, positions, the PLE placeholder, masks, then `hidden`
        assert [s for s, _ in inputs] == [(2, 1), (2, 1), (1,), (2, 1, 1, 64), (2, 1, 1, 16), (2, 1, 64)]
        assert written and all(written.values())  # every buffer replaced by its unchanged copy: state
        capsys.readouterr()  # the build's progress
        m = Manifest.read(out)
        assert m.extend_graphs == [[2, 4, "all"]] and m.extend_buckets == []
        assert "-O2" in m.compiler_flags["extend_2x4_all_h"] and "-O2" in m.compiler_flags["draft"]
        assert m.drafter["name"] == "drafter" and m.drafter["use_ordered_embeddings"] is True
        saved = load_file(str(out / "weights" / "tp0.safetensors"))
        assert saved["drafter.masked_embedding.token_ordering"].dtype == torch.int32
        assert "drafter.pre_projection.weight" in saved and "drafter.model.embed_tokens.weight" in saved
        with pytest.raises(UserError) as e:
            load_from_artifacts(EngineConfig(model=str(d), backend="neuron", artifacts=str(out),
                                             speculative_method="ngram", num_speculative_tokens=2))
        assert e.value.param == "num_speculative_tokens"
        other = write_tiny_assistant(d, tmp_path / "other", seed=1, hidden=16)
        with pytest.raises(UserError, match="built for another drafter") as e:
            load_from_artifacts(EngineConfig(model=str(d), backend="neuron", artifacts=str(out),
                                             draft_model=str(other), num_speculative_tokens=3))
        assert e.value.param == "draft_model"
        prompt = [2] + list(range(40, 52)) * 2  # repeats itself: the ngram drafter proposes from the first copy
        args = ["--model", str(d), "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", "12", "--ignore-eos",
                "--json"]
        calls.clear()
        assert generate_main(args + ["--backend", "neuron", "--artifacts", str(out), "--speculative-method", "ngram",
                                     "--num-speculative-tokens", "3"]) == 0
        ngram = json.loads(capsys.readouterr().out)["token_ids"]
        assert ("forward", "extend_2x4_all_h") in calls
        eng = build_engine(EngineConfig(model=str(d), backend="neuron", artifacts=str(out), draft_model=str(drafter),
                                        num_speculative_tokens=3))
        calls.clear()
        seq = eng.new_sequence(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
        list(eng.run_all([seq]))
        assert eng.drafter.steps > 0 and ("forward", "draft") in calls and ("forward", "extend_2x4_all_h") in calls
    assert generate_main(args + ["--max-context", "64", "--dtype", "bfloat16"]) == 0
    plain = json.loads(capsys.readouterr().out)["token_ids"]
    assert ngram == plain == seq.output_ids and len(plain) == 12


@pytest.mark.slow
def test_neuron_build_with_the_12b_unified_drafter_serves_its_drafts(tiny_dirs, tmp_path, capsys):
    """The 12B-like target with a `gemma4_unified_assistant` drafter: `compile build --draft-model` traces the draft
    graph (the manifest records that drafter); served from the artifacts through the double, it drafts and the
    greedy tokens equal the plain CPU engine's in bf16; an E-model target refuses it at build, naming draft_model."""
    from neuron_workers.testing.tiny_assistant import write_tiny_unified_assistant

    d, out = tiny_dirs["gemma4-12b-tiny"], tmp_path / "u"
    drafter = write_tiny_unified_assistant(d, tmp_path / "drafter", seed=1)
    prompt = ",".join(map(str, [2] + [(5 * i) % 60 + 7 for i in range(13)]))
    args = ["--model", str(d), "--prompt-ids", prompt, "--max-tokens", "12", "--ignore-eos", "--json"]
    with neuron_double.installed() as calls:
        assert compile_main(["build", "--model", str(d), "--max-context", "64", "--prefill-buckets", "32",
                             "--batch", "2", "--prefill-chunk", "0", "--num-speculative-tokens", "2",
                             "--draft-model", str(drafter), "--out", str(out)]) == 0
        assert [c[1] for c in calls if c[0] == "trace"][-1] == "draft"
        assert Manifest.read(out).drafter["name"] == "drafter"
        capsys.readouterr()
        calls.clear()
        assert generate_main(args + ["--backend", "neuron", "--artifacts", str(out), "--draft-model", str(drafter),
                                     "--num-speculative-tokens", "2"]) == 0
        drafted = json.loads(capsys.readouterr().out)["token_ids"]
        assert ("forward", "draft") in calls and ("forward", "extend_2x3_all_h") in calls
        e2b = tiny_dirs["gemma4-e2b-tiny"]
        assert compile_main(["build", "--model", str(e2b), "--max-context", "64", "--prefill-buckets", "32",
                             "--batch", "2", "--num-speculative-tokens", "2", "--draft-model", str(drafter),
                             "--out", str(tmp_path / "refused")]) == 2
        assert "gemma4_unified targets" in capsys.readouterr().err
    assert generate_main(args + ["--max-context", "64", "--dtype", "bfloat16"]) == 0
    plain = json.loads(capsys.readouterr().out)["token_ids"]
    assert drafted == plain and len(plain) == 12
