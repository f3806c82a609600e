"""The layers of docs/design.md, read from the import graph: the pure policies import no Ray,
vLLM, web framework or asyncio (not even through another module of ours); only the vLLM engine
module imports vllm or torch; the config and policies never import the deployments; and the
checker itself catches a policy that imports ray."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("serve_app", "deployments", "autoscaling")
POLICY_PACKAGES = ("serve_app/policies",)
POLICY_MODULES = ("autoscaling/policy.py",)
# What a pure policy may not reach: I/O frameworks, the cluster, the engine, the event loop.
NOT_IN_POLICIES = {
    "ray",
    "vllm",
    "torch",
    "fastapi",
    "starlette",
    "asyncio",
    "httpx",
    "uvicorn",
    "opentelemetry",
    "prometheus_client",
    "pydantic",
}
ENGINE_ONLY = {"vllm", "torch"}
# The serving engine, and model preparation (`llmserve prepare`: converting and quantizing
# weights, torch imported inside the functions), which never runs on the request path.
HEAVY_MODULES = {"deployments.engine.vllm_engine", "serve_app.model_source", "serve_app.quantize"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, by absolute name (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = (
        module_name(path, root).rsplit(".", 1)[0]
        if path.name != "__init__.py"
        else module_name(path, root)
    )
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def project_modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}


def reach(start: str, modules: dict[str, Path], root: Path = ROOT) -> dict[str, str]:
    """Every module `start` imports, directly or through modules of ours: name -> via whom."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        current = todo.pop()
        for name in imports_of(modules[current], root):
            top = name.split(".")[0]
            if top not in seen:
                seen[top] = current
            if name in modules and name not in seen:
                seen[name] = current
                todo.append(name)
    return seen


def policy_modules(root: Path = ROOT) -> list[str]:
    names = [module_name(p, root) for d in POLICY_PACKAGES for p in (root / d).rglob("*.py")]
    return sorted(names + [module_name(root / m, root) for m in POLICY_MODULES])


def forbidden_in_policies(root: Path = ROOT, packages=PACKAGES) -> dict[str, list[str]]:
    modules = project_modules(root, packages)
    out = {}
    for name in policy_modules(root):
        reached = reach(name, modules, root)
        bad = sorted(f"{m} (via {reached[m]})" for m in reached if m in NOT_IN_POLICIES)
        if bad:
            out[name] = bad
    return out


def test_the_policies_are_pure():
    assert len(policy_modules()) >= 6, policy_modules()
    assert forbidden_in_policies() == {}


def test_only_the_engine_module_imports_vllm_or_torch():
    for name, path in project_modules().items():
        heavy = {n.split(".")[0] for n in imports_of(path)} & ENGINE_ONLY
        assert not heavy or name in HEAVY_MODULES, (name, heavy)


@pytest.mark.parametrize(
    "layer",
    [
        "serve_app.config",
        "serve_app.admission_config",
        "serve_app.openai_protocol",
        "serve_app.replica_call",
        "serve_app.tenancy",
        "serve_app.vllm_args",
    ],
)
def test_config_and_protocol_never_reach_the_deployments(layer):
    reached = reach(layer, project_modules())
    assert not [m for m in reached if m.startswith("deployments")], reached


def test_the_checker_catches_a_policy_that_imports_ray(tmp_path, monkeypatch):
    """The check above fails when a policy imports ray, also through a helper module."""
    policies = tmp_path / "serve_app" / "policies"
    policies.mkdir(parents=True)
    (tmp_path / "serve_app" / "__init__.py").write_text("")
    (policies / "__init__.py").write_text("")
    (tmp_path / "serve_app" / "helper.py").write_text("import ray\n")
    (policies / "clean.py").write_text("import math\n")
    (policies / "sneaky.py").write_text("from serve_app import helper\n")
    (tmp_path / "autoscaling").mkdir()
    (tmp_path / "autoscaling" / "policy.py").write_text("from ray import serve\n")
    found = forbidden_in_policies(tmp_path, packages=("serve_app", "autoscaling"))
    assert set(found) == {"serve_app.policies.sneaky", "autoscaling.policy"}, found
    assert any("ray" in f for f in found["serve_app.policies.sneaky"])
