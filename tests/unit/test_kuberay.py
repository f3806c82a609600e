"""kuberay/rayservice.yaml, checked as far as offline tools allow.

No package on PyPI ships the RayService CRD's schema, so the manifest is checked against what is
available: its fields by hand, the embedded Serve config with Ray Serve's own schema
(ServeDeploySchema) and our AppConfig, the cluster spec through the very function Ray's in-tree
autoscaler uses on KubeRay to read a RayCluster (which validates its result against Ray's cluster
config schema), and the pod templates against Kubernetes' own schema (kubernetes-validate, strict:
unknown fields fail) where that package is installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import yaml
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.serve.schema import ServeDeploySchema

from llmserve.config.app_config import AppConfig

ROOT = Path(__file__).resolve().parents[2]
GPU_KEY = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def manifest() -> dict:
    docs = list(yaml.safe_load_all((ROOT / "kuberay" / "rayservice.yaml").read_text()))
    assert len(docs) == 1
    return docs[0]


@pytest.fixture(scope="module")
def serve_config(manifest) -> dict:
    raw = manifest["spec"]["serveConfigV2"]
    assert isinstance(raw, str), "serveConfigV2 is a YAML string, not a mapping"
    return yaml.safe_load(raw)


@pytest.fixture(scope="module")
def local_config() -> dict:
    return yaml.safe_load((ROOT / "serve_config.yaml").read_text())


@pytest.fixture(scope="module")
def cluster(manifest) -> dict:
    return manifest["spec"]["rayClusterConfig"]


def gpu_groups(cluster: dict) -> list[dict]:
    def limits(group: dict) -> dict:
        return group["template"]["spec"]["containers"][0]["resources"].get("limits", {})

    return [g for g in cluster["workerGroupSpecs"] if GPU_KEY in limits(g)]


def test_kind_and_api_version(manifest):
    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] == "RayService"
    assert set(manifest) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(manifest["spec"]) == {"serveConfigV2", "rayClusterConfig"}
    assert manifest["metadata"]["name"] == "llmserve"


def test_serve_config_passes_ray_serve_schema(serve_config):
    schema = ServeDeploySchema.model_validate(serve_config)
    assert schema.http_options.host == "0.0.0.0"  # reachable from the pod's Service
    assert len(schema.applications) == 1


def test_same_application_as_serve_config_yaml(serve_config, local_config):
    app, local = serve_config["applications"][0], local_config["applications"][0]
    assert app["import_path"] == local["import_path"] == "llmserve.app:build_app"
    assert (app["name"], app["route_prefix"]) == (local["name"], local["route_prefix"])
    ours, theirs = AppConfig.model_validate(app["args"]), AppConfig.model_validate(local["args"])
    # Same models and admission bounds; where replicas run (and how many) differs, and the
    # tenants: the local demo's anonymous tenant and demo keys stay out of production.
    assert [(m.name, m.source, m.max_tokens_default) for m in ours.models] == [
        (m.name, m.source, m.max_tokens_default) for m in theirs.models
    ]
    assert ours.admission.model_dump(exclude={"anonymous_tenant"}) == theirs.admission.model_dump(
        exclude={"anonymous_tenant"}
    )
    assert (
        serve_config["http_options"]["request_timeout_s"]
        == local_config["http_options"]["request_timeout_s"]
    )
    for m, lm in zip(ours.models, theirs.models):
        assert m.engine.model_dump(
            exclude={"enforce_eager", "cpu_kv_cache_space_gib"}
        ) == lm.engine.model_dump(exclude={"enforce_eager", "cpu_kv_cache_space_gib"})
        assert m.engine.cpu_kv_cache_space_gib is None  # CPU-only setting, not on GPU workers


def test_model_replicas_ask_for_a_gpu_and_fit_the_gpu_workers(serve_config, cluster):
    args = AppConfig.model_validate(serve_config["applications"][0]["args"])
    (group,) = gpu_groups(cluster)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    gpus_per_pod, cpus_per_pod = int(limits[GPU_KEY]), float(limits["cpu"])
    for m in args.models:
        d = m.deployment
        assert d.num_gpus >= 1, m.name
        assert d.num_gpus <= gpus_per_pod and d.num_cpus <= cpus_per_pod, m.name
        assert d.autoscaling is not None, f"{m.name}: the policy sets the replica count"
        # Every replica the policy may ask for can get a GPU worker.
        assert d.autoscaling.max_replicas * d.num_gpus <= group["maxReplicas"] * gpus_per_pod
    assert args.router.num_cpus == 0  # the Router may sit on the 0-CPU head, beside the proxy


def test_head_has_no_gpu_and_takes_no_replicas(cluster):
    head = cluster["headGroupSpec"]
    params = head["rayStartParams"]
    assert params["num-cpus"] == "0"
    assert "num-gpus" not in params or params["num-gpus"] == "0"
    assert params["metrics-export-port"] == "8080"
    assert all(isinstance(v, str) for v in params.values()), "rayStartParams are strings"
    for c in head["template"]["spec"]["containers"]:
        for kind in ("limits", "requests"):
            assert not any(k.endswith("gpu") for k in c.get("resources", {}).get(kind, {}))


def test_gpu_worker_group(cluster):
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["rayVersion"] == ray.__version__  # the Ray this project pins
    (group,) = gpu_groups(cluster)
    assert group["minReplicas"] == 0 and group["maxReplicas"] == 4
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"][GPU_KEY] == "1"
    assert resources["requests"].get(GPU_KEY, resources["limits"][GPU_KEY]) == "1"
    assert group["rayStartParams"].get("metrics-export-port") == "8080"
    assert all(isinstance(v, str) for v in group["rayStartParams"].values())


def test_ray_autoscaler_reads_the_cluster_spec(cluster, serve_config):
    # What Ray's autoscaler does with the RayCluster KubeRay makes from rayClusterConfig; it
    # raises if the result does not pass Ray's cluster config schema.
    config = _derive_autoscaling_config_from_ray_cr(
        {"metadata": {"name": "llmserve", "namespace": "default"}, "spec": cluster}
    )
    types = config["available_node_types"]
    head = types["headgroup"]["resources"]
    assert head["CPU"] == 0 and head.get("GPU", 0) == 0
    gpu = types["gpu"]
    assert (gpu["min_workers"], gpu["max_workers"]) == (0, 4)
    assert gpu["resources"]["GPU"] == 1
    # An LLMServer replica's demand can be met by a GPU worker and never by the head.
    args = AppConfig.model_validate(serve_config["applications"][0]["args"])
    for m in args.models:
        demand = {"CPU": m.deployment.num_cpus, "GPU": m.deployment.num_gpus}
        assert all(gpu["resources"].get(k, 0) >= v for k, v in demand.items())
        assert any(head.get(k, 0) < v for k, v in demand.items() if v > 0)


def test_pod_templates_pass_kubernetes_schema(cluster):
    import kubernetes_validate as kv

    templates = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    for t in templates:
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "llmserve"},
            "template": t,
        }
        kv.validate(pod_template, kv.latest_version(), strict=True)  # raises on unknown fields


def test_the_production_manifest_carries_no_key_and_no_anonymous_tenant(serve_config, manifest):
    args = serve_config["applications"][0]["args"]
    config = AppConfig.model_validate(args)
    assert config.admission.anonymous_tenant is None
    assert config.tenants and all(t.api_key_env for t in config.tenants)
    assert not any(t.api_keys or t.api_key_sha256 for t in config.tenants)
    text = (ROOT / "kuberay" / "rayservice.yaml").read_text()
    assert "sk-" not in text.replace("sk-...", ""), "a key in the manifest"


def test_the_cluster_runs_with_token_auth_and_keys_from_secrets(cluster):
    pods = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "llmserve-ray-token"
        # The rest of `llmserve ray-env --cluster`, value for value.
        from llmserve.edge.ray_env import cluster_env, path_env

        wanted = cluster_env(single_machine=False)
        # Paths of this machine: the wrapper's, the binary's, and HAProxy's files, whose run dir
        # names this user. A pod's /tmp is its own: Ray's defaults there serve, and the shield
        # follows them (llmserve/router/shield.py: `folder`).
        machine = {"RAY_SERVE_HAPROXY_BINARY_PATH", "LLMSERVE_HAPROXY_REAL", *path_env()}
        for key in wanted.keys() - machine:
            assert env[key]["value"] == wanted[key], key
        assert not machine & (env.keys() - {"RAY_SERVE_HAPROXY_BINARY_PATH"})
        assert {"secretRef": {"name": "llmserve-api-keys"}} in container["envFrom"]
