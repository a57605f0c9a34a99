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
