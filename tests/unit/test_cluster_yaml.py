"""cluster.yaml must pass Ray's own cluster-config validation, and fit the serve config."""

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[2]


def test_cluster_yaml_passes_ray_schema():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    # prepare_config fills the provider defaults exactly as `ray up` does before validating.
    validate_config(prepare_config(config))  # raises on a schema violation
    gpu_types = [
        name
        for name, t in config["available_node_types"].items()
        if t["resources"].get("GPU", 0) > 0
    ]
    assert gpu_types, "the cluster needs GPU worker types for LLMServer replicas"
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert all(config["available_node_types"][t]["min_workers"] == 0 for t in gpu_types)


def test_cluster_yaml_keeps_the_dashboard_on_loopback_and_turns_token_auth_on():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    (head_start,) = [c for c in config["head_start_ray_commands"] if "ray start" in c]
    assert "--dashboard-host=127.0.0.1" in head_start and "0.0.0.0" not in head_start
    for cmd in [head_start] + [c for c in config["worker_start_ray_commands"] if "ray start" in c]:
        assert "llmserve ray-env --cluster" in cmd  # RAY_AUTH_MODE=token, before ray start
    assert "/home/ubuntu/.ray/auth_token" in config["file_mounts"]  # one token, every node
