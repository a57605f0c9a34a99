"""compile plan: per-core HBM and host RAM from the real configs, counted independently of the planner, and
every model of configs/inf2.yaml on the instance it names."""

from __future__ import annotations

import json

import pytest
import torch

from compile.__main__ import main as compile_main
from neuron_workers.parallel.shard_plan import plan_for

from conftest import CONFIGS, inf2_config_copy, meta_shapes, real_config


class TestPlanOnRealConfigs:
    @pytest.mark.parametrize("size,tp", [("E2B", 1), ("E4B", 2), ("12B", 2), ("12B", 1)])
    def test_weights_match_an_independent_meta_count(self, size, tp):
        from compile.plan import make_plan_report

        cfg = real_config(size)
        shapes = meta_shapes(cfg)  # HF's own model on the meta device, PLE table excluded
        report = make_plan_report(cfg, tp, 1, 4096, "inf2.24xlarge")
        assert report.weights_per_core == plan_for(cfg, tp).weight_bytes_per_rank(shapes)
        if tp == 1:
            assert report.weights_per_core == 2 * sum(torch.Size(s).numel() for k, s in shapes.items()
                                                      if k != "lm_head.weight")

    def test_ple_table_and_kv_bytes(self):
        from compile.plan import make_plan_report

        e2b = make_plan_report(real_config("E2B"), 1, 1, 4096, "inf2.xlarge")
        assert e2b.ple_host == 262144 * 35 * 256 * 2
        # sliding rings: the window plus RING_SLACK (64) positions
        assert e2b.kv_per_core == 3 * 2 * 1 * 4096 * 512 * 2 + 12 * 2 * 1 * (512 + 64) * 256 * 2
        b12 = make_plan_report(real_config("12B"), 2, 1, 4096, "inf2.24xlarge")
        assert b12.kv_per_core == 8 * 2 * 1 * 4096 * 512 * 2 + 40 * 2 * 4 * (1024 + 64) * 256 * 2

    @pytest.mark.parametrize("size,tp,instance", [("E2B", 1, "inf2.xlarge"), ("E4B", 2, "inf2.8xlarge"),
                                                  ("12B", 2, "inf2.24xlarge")])
    def test_default_sizes_fit(self, size, tp, instance, capsys):
        path = str(CONFIGS / f"gemma-4-{size}.text_config.json")
        assert compile_main(["plan", "--model", path, "--tp", str(tp), "--instance", instance]) == 0
        assert "fits" in capsys.readouterr().out

    def test_12b_on_one_core_is_refused_with_numbers(self, capsys):
        path = str(CONFIGS / "gemma-4-12B.text_config.json")
        assert compile_main(["plan", "--model", path, "--tp", "1", "--json"]) == 2
        out = json.loads(capsys.readouterr().out)
        assert not out["fits"] and out["largest_context"] is None
        assert out["weights_per_core"] > out["hbm_per_core"] and "GiB per core" in out["reasons"][0]

    def test_largest_context_is_the_boundary(self):
        from compile.plan import make_plan_report

        cfg = real_config("12B")
        best = make_plan_report(cfg, 2, 1, 4096, "inf2.24xlarge").largest_context
        assert make_plan_report(cfg, 2, 1, best, "inf2.24xlarge").fits
        assert not make_plan_report(cfg, 2, 1, best + 128, "inf2.24xlarge").fits

    def test_bad_plan_input(self, capsys):
        assert compile_main(["plan", "--model", "/nope.json"]) == 2
        assert compile_main(["plan", "--model", str(CONFIGS / "gemma-4-E4B.text_config.json"), "--tp", "3"]) == 2
        assert compile_main(["plan", "--model", str(CONFIGS / "gemma-4-E4B.text_config.json"),
                             "--instance", "inf9.huge"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 3


def test_every_model_of_the_inf2_config_fits_its_instance(tmp_path, capsys):
    path, doc = inf2_config_copy(tmp_path)
    assert compile_main(["plan", "--config", str(path), "--json"]) == 0
    plans = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    args = doc["applications"][0]["args"]
    assert len(plans) == len(args["models"]) == 3 and all(p["fits"] for p in plans)
    for p, m in zip(plans, args["models"]):
        assert (p["tp"], p["batch"], p["max_context"], p["instance"]) == (m["tp"], m["max_batch"], m["max_context"],
                                                                           args["instance"])
    cores = sum(m["tp"] * m["min_replicas"] for m in args["models"])
    assert cores <= {"inf2.24xlarge": 12, "inf2.48xlarge": 24}[args["instance"]]
    assert compile_main(["plan", "--config", str(path), "--model", "nope"]) == 2
    assert "no model named 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("size,batch", [("E2B", 32), ("E4B", 32), ("12B", 4)])
def test_an_mtp_drafter_adds_its_weights_and_says_what_a_draft_step_reads(size, batch, tmp_path, capsys):
    """`--draft-model DIR` (a drafter's config.json: real assistants' sizes are not in our references, so these
    are made-up drafters for the real targets): its weights, counted from the config, equal an independent count
    of the module the loader builds (on the meta device; bf16, token_ordering int32) and join the per-core total;
    a draft step reads its layers, each row's candidate head rows and the store layers' whole K/V. Without it
    nothing is said about a drafter."""
    from compile.plan import GIB
    from neuron_workers.model.assistant import Assistant, read_assistant_info
    from neuron_workers.model.dims import ModelDims
    from neuron_workers.testing.tiny_assistant import write_assistant_config

    target = CONFIGS / f"gemma-4-{size}.text_config.json"
    draft = write_assistant_config(target, tmp_path / "drafter", hidden=256, num_centroids=2048, top_k=32)
    base = ["plan", "--model", str(target), "--batch", str(batch), "--instance", "inf2.xlarge", "--json"]
    compile_main(base)
    plain = json.loads(capsys.readouterr().out)
    compile_main(base + ["--draft-model", str(draft)])
    got = json.loads(capsys.readouterr().out)
    assert "drafter" not in plain and got["drafter"]["name"] == "drafter"
    with torch.device("meta"):
        module = Assistant(read_assistant_info(draft, with_weights=False))
    want = sum(t.numel() * (4 if k.endswith("token_ordering") else 2) for k, t in module.state_dict().items())
    assert got["drafter"]["weights"] == want
    assert got["total_per_core"] == plain["total_per_core"] + want and got["kv_per_core"] == plain["kv_per_core"]
    dims = ModelDims.from_hf(real_config(size))
    kv = {j: 2 * batch * dims.kv_heads[j] * dims.head_dims[j] * 2 for j in dims.kv_layers}  # bytes per position
    full, sliding = (max(i for i in dims.kv_layers if dims.layer_types[i] == t)
                     for t in ("full_attention", "sliding_attention"))
    store_kv = kv[full] * 4096 + kv[sliding] * dims.ring_size(4096)
    head_rows = 32 * 262144 // 2048
    assert got["drafter"]["head_rows"] == head_rows
    rest = want - 262144 * 256 * 2 - 262144 * 4  # all but its embedding and token ordering
    assert got["drafter"]["draft_read"] == rest + batch * head_rows * (256 * 2 + 4) + batch * dims.hidden_size * 2 \
        + store_kv
    compile_main(base[:-1] + ["--draft-model", str(draft)])
    text = capsys.readouterr().out
    assert f"+ MTP drafter {want / GIB:6.2f} GiB + KV cache" in text and "MTP drafter drafter (it adds no KV)" in text
    compile_main(base[:-1])
    assert "drafter" not in capsys.readouterr().out


def test_at_tp2_the_drafter_layers_are_split_and_it_reads_each_rank_kv(tmp_path, capsys):
    """E4B at tp=2 with a made-up drafter: per core, its layers' weights are halved (query heads split as the
    rank's K/V, MLP split), its embedding, head and projections whole; a draft step reads the rank's K/V."""
    from neuron_workers.model.assistant import Assistant, read_assistant_info
    from neuron_workers.testing.tiny_assistant import write_assistant_config

    target = CONFIGS / "gemma-4-E4B.text_config.json"
    draft = write_assistant_config(target, tmp_path / "drafter", hidden=256, num_centroids=2048, top_k=32)
    base = ["plan", "--model", str(target), "--batch", "8", "--instance", "inf2.xlarge", "--json",
            "--draft-model", str(draft)]
    got = {}
    for tp in (1, 2):
        compile_main(base + ["--tp", str(tp)])
        got[tp] = json.loads(capsys.readouterr().out)
    with torch.device("meta"):
        module = Assistant(read_assistant_info(draft, with_weights=False))
    layers = sum(t.numel() * 2 for k, t in module.state_dict().items() if k.startswith("model.layers."))
    assert layers > 0 and got[1]["drafter"]["weights"] - got[2]["drafter"]["weights"] == layers // 2
    kv1, kv2 = got[1]["kv_per_core"], got[2]["kv_per_core"]  # E4B's 2 KV heads split: half the KV a core
    read_drop = got[1]["drafter"]["draft_read"] - got[2]["drafter"]["draft_read"]
    assert kv2 * 2 == kv1 and read_drop > layers // 2  # the layers' half and the store layers' other-rank K/V
    assert got[2]["fits"] and got[2]["total_per_core"] < got[1]["total_per_core"]


def test_the_12b_unified_drafter_is_planned_and_refused_for_an_e_model(tmp_path, capsys):
    """A `gemma4_unified_assistant` config.json (the 12B's drafter kind) plans beside the real 12B: its weights
    equal the loader's module's (a `Gemma4UnifiedTextModel` stack); beside E4B it is refused, naming the kind."""
    from neuron_workers.model.assistant import Assistant, read_assistant_info
    from neuron_workers.testing.tiny_assistant import write_assistant_config

    twelve = CONFIGS / "gemma-4-12B.text_config.json"
    draft = write_assistant_config(twelve, tmp_path / "drafter", hidden=256, num_centroids=2048, top_k=32,
                                   unified=True)
    assert json.loads((draft / "config.json").read_text())["model_type"] == "gemma4_unified_assistant"
    assert compile_main(["plan", "--model", str(twelve), "--batch", "4", "--instance", "inf2.xlarge", "--json",
                         "--draft-model", str(draft)]) in (0, 2)
    got = json.loads(capsys.readouterr().out)
    info = read_assistant_info(draft, with_weights=False)
    with torch.device("meta"):
        module = Assistant(info)
    assert type(module.model).__name__ == "Gemma4UnifiedTextModel"
    want = sum(t.numel() * (4 if k.endswith("token_ordering") else 2) for k, t in module.state_dict().items())
    assert got["drafter"]["weights"] == want
    e4b = CONFIGS / "gemma-4-E4B.text_config.json"
    assert compile_main(["plan", "--model", str(e4b), "--batch", "4", "--instance", "inf2.xlarge",
                         "--draft-model", str(draft)]) == 2
    assert "gemma4_unified targets, not a gemma4_text one" in capsys.readouterr().err


@pytest.mark.parametrize("size,tp,mib", [("E2B", 1, 6), ("E2B", 2, 6), ("E4B", 1, 20), ("E4B", 2, 10),
                                         ("12B", 1, 320), ("12B", 2, 160)])
def test_plan_counts_a_kept_sliding_window(size, tp, mib, capsys):
    """One kept window (prefix_windows) is the sliding layers' K and V over the window, a rank's share of the
    heads: the real sizes' bytes, in the report and its JSON, as a pool of one built on the meta device holds."""
    from neuron_workers.model.dims import ModelDims
    from neuron_workers.model.kept_windows import make_pool, sliding_buffers
    from neuron_workers.model.spec import kv_specs

    dims = ModelDims.from_hf(real_config(size))
    heads = plan_for(real_config(size), tp).kv_heads if tp > 1 else None
    kv = [torch.empty(t.shape, dtype=torch.bfloat16, device="meta") for t in kv_specs(dims, 1, 4096, torch.bfloat16,
                                                                                        heads)]
    pool = make_pool(kv, sliding_buffers(dims), 1, dims.sliding_window)
    assert sum(t.numel() * 2 for t in pool) == dims.window_bytes(2, tp) == mib * 2**20
    assert compile_main(["plan", "--model", str(CONFIGS / f"gemma-4-{size}.text_config.json"), "--tp", str(tp),
                         "--batch", "4", "--max-context", "4096", "--json"]) == (2 if (size, tp) == ("12B", 1) else 0)
    assert json.loads(capsys.readouterr().out)["window_per_core"] == mib * 2**20  # (the 12B at tp=1 fits no core)


def _meta_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("size", ["E2B", "E4B", "12B"])
def test_plan_media_encoder_bytes_equal_transformers_modules(size, capsys):
    """The media line's bytes: the released encoders, as transformers 5.23 builds them from their configs (the
    classes' defaults, which the checkpoints use: vision 167.4M, audio 304.8M, 12B embedders 52.4M), plus their
    embedders into this size's text width, counted on the meta device, in bf16."""
    import transformers as tf

    cfg = real_config(size)
    with torch.device("meta"):
        if size == "12B":
            vis = _meta_count(tf.models.gemma4_unified.modeling_gemma4_unified.Gemma4UnifiedVisionEmbedder(
                tf.Gemma4UnifiedVisionConfig(), cfg))
            aud = _meta_count(tf.models.gemma4_unified.modeling_gemma4_unified.Gemma4UnifiedMultimodalEmbedder(
                tf.Gemma4UnifiedAudioConfig(), cfg))
        else:
            m4 = tf.models.gemma4.modeling_gemma4
            vc, ac = tf.Gemma4VisionConfig(), tf.Gemma4AudioConfig()
            vis = _meta_count(m4.Gemma4VisionModel(vc)) + _meta_count(m4.Gemma4MultimodalEmbedder(vc, cfg))
            aud = _meta_count(m4.Gemma4AudioModel(ac)) + _meta_count(m4.Gemma4MultimodalEmbedder(ac, cfg))
    want = {"E2B": (167.4e6, 304.8e6 + 3.6e6), "E4B": (167.4e6, 304.8e6 + 5.9e6), "12B": (52.4e6, 0)}[size]
    assert abs(vis + aud - sum(want)) < 0.1e6 * 2  # the reference's rounded counts
    tp = 2 if size == "12B" else 1
    assert compile_main(["plan", "--model", str(CONFIGS / f"gemma-4-{size}.text_config.json"), "--tp", str(tp),
                         "--json"]) == 0
    media = json.loads(capsys.readouterr().out)["media"]
    assert (media["vision_weights"], media["audio_weights"], media["weights"]) == (2 * vis, 2 * aud, 2 * (vis + aud))


def test_plan_media_transients_and_fit(capsys):
    """An E-model vision graph attends over every patch: at the 1120-token bucket (10080 patches, 12 heads) its
    fp32 scores alone are ~4.5 GiB, 16x the 280 bucket's; E4B at batch 8 / 4096 fits its text graphs and a 280-bucket
    vision graph but not a 1120 one, which the text line and the media line both say; at batch 1 all fit."""
    from compile.plan import GIB

    e4b = str(CONFIGS / "gemma-4-E4B.text_config.json")
    compile_main(["plan", "--model", e4b, "--batch", "8", "--max-context", "4096", "--json"])
    got = json.loads(capsys.readouterr().out)
    t = got["media"]["transients"]
    assert t["image_1120"] > 12 * 10080**2 * 4 > 4 * GIB and t["image_1120"] > 10 * t["image_280"]
    assert got["fits"] and got["media"]["fits"] == {"image_280": True, "image_1120": False, "audio_30s": True}
    assert got["media"]["free_after"] < t["image_1120"]
    compile_main(["plan", "--model", e4b, "--batch", "8", "--max-context", "4096"])
    text = capsys.readouterr().out
    assert "image@1120 4946 MiB does not fit" in text and "image@280 365 MiB fits" in text
    compile_main(["plan", "--model", e4b, "--batch", "1", "--max-context", "4096", "--json"])
    assert all(json.loads(capsys.readouterr().out)["media"]["fits"].values())
