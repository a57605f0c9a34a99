"""The KubeRay RayService (configs/kuberay/rayservice.yaml) is generated from configs/inf2.yaml: this fails
when the two drift, and checks what the manifest promises (head without NeuronCores, a worker group per
inf2 type requesting the Neuron device plugin's devices and declaring neuron_cores, the key from a Secret,
readiness on /health)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from compile.kuberay import main, rayservice, render
from compile.plan import INSTANCES

ROOT = Path(__file__).resolve().parents[2]
CONFIG, MANIFEST = ROOT / "configs" / "inf2.yaml", ROOT / "configs" / "kuberay" / "rayservice.yaml"


def test_the_committed_manifest_is_what_inf2_yaml_generates(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the header names the config by its relative path
    assert main("configs/inf2.yaml", str(MANIFEST), check=True) == 0, capsys.readouterr().out


def test_a_changed_serve_config_is_drift(tmp_path, capsys):
    src = yaml.safe_load(CONFIG.read_text())
    src["applications"][0]["args"]["models"][0]["max_batch"] = 8
    changed = tmp_path / "inf2.yaml"
    changed.write_text(yaml.safe_dump(src, sort_keys=False))
    assert main(str(changed), str(MANIFEST), check=True) == 1
    assert "differs" in capsys.readouterr().out


def limits(container):
    return container["resources"]["limits"]


def test_manifest_shape_head_workers_secret_readiness(monkeypatch):
    monkeypatch.chdir(ROOT)
    ServeDeploySchema = pytest.importorskip("ray.serve.schema").ServeDeploySchema  # noqa: N806 (not in the xla venv)

    doc = yaml.safe_load(MANIFEST.read_text())
    src = yaml.safe_load(CONFIG.read_text())
    assert doc["kind"] == "RayService" and doc == rayservice(src)
    serve_cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_cfg)  # what KubeRay hands Serve is a valid serve config
    args = serve_cfg["applications"][0]["args"]
    assert args.pop("base_dir") == "/models" and args == src["applications"][0]["args"]
    cluster = doc["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert json.loads(json.loads(head["rayStartParams"]["resources"])) == {"neuron_cores": 0}
    assert not any("aws.amazon.com/neuron" in limits(c) for c in head["template"]["spec"]["containers"])
    groups = {g["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"]: g
              for g in cluster["workerGroupSpecs"]}
    assert set(groups) == set(INSTANCES)
    for instance, g in groups.items():
        cores = INSTANCES[instance][0]
        (c,) = g["template"]["spec"]["containers"]
        assert json.loads(json.loads(g["rayStartParams"]["resources"])) == {"neuron_cores": cores}
        assert limits(c)["aws.amazon.com/neuron"] * 2 == cores
        assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
        assert c["env"][0] == {"name": "GEMMA4_API_KEY", "valueFrom": {"secretKeyRef": {"name": "gemma4-api-key",
                                                                                        "key": "key"}}}
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert groups[src["applications"][0]["args"]["instance"]]["minReplicas"] == 1
    assert "&id" not in render("configs/inf2.yaml")  # no YAML anchors: plain for kubectl and reviewers


def test_every_node_gets_the_serve_settings_the_app_runs_with():
    from compile.kuberay import SERVE_ENV
    from serve_app.ops.ray_env import CLUSTER, shed_env

    assert SERVE_ENV == CLUSTER
    spec = rayservice(yaml.safe_load(CONFIG.read_text()))["spec"]["rayClusterConfig"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for g in groups:
        env = {e["name"]: e.get("value") for e in g["template"]["spec"]["containers"][0]["env"]}
        assert all(env.get(k) == v for k, v in CLUSTER.items()), env
        shed = env["RAY_SERVE_HAPROXY_BINARY_PATH"]  # the wrapper, where the image keeps this repository
        assert shed == shed_env()["RAY_SERVE_HAPROXY_BINARY_PATH"].replace(str(ROOT), "/app"), shed
