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
        name for name, t in config["available_node_types"].items()
        if t["resources"].get("GPU", 0) > 0
    ]  # fmt: skip
    assert gpu_types, "the cluster needs GPU worker types for LLMServer replicas"
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert all(config["available_node_types"][t]["min_workers"] == 0 for t in gpu_types)
