"""The layers of docs/design.md, read from the import graph: each package of `llmserve/` (one
runtime role each) imports only packages of the layers below its own; the pure policies import no
Ray, vLLM, web framework or asyncio (not even through another module of ours); only the vLLM
engine module and model preparation import vllm or torch; and the checkers themselves catch a
policy that imports ray and a package that imports one above it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("llmserve",)
POLICY_PACKAGES = ("llmserve/policies",)
# llmserve's packages from the bottom up: a package imports only packages of a lower layer.
LAYERS = (
    {"protocol"},  # what the roles say to each other: plain data
    {"policies"},  # pure decisions
    {"config"},  # the app's args, validated
    {"edge", "observability"},  # the node around the platform; metrics and traces
    {"planning"},  # offline: model preparation, the memory plan
    {"responses", "request_router", "autoscaling"},  # roles the Router and replicas call
    {"router", "replica"},  # the two roles on a request's path
    {"app", "ops"},  # the wiring, and the CLI
)
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
# weights, building test adapters, torch imported inside the functions), which never runs on
# the request path.
HEAVY_MODULES = {
    "llmserve.replica.engine.vllm_engine",
    "llmserve.planning.model_source",
    "llmserve.planning.quantize",
    "llmserve.planning.adapters",
}


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
    return sorted(module_name(p, root) for d in POLICY_PACKAGES for p in (root / d).rglob("*.py"))


def layer_of(module: str) -> int | None:
    """The layer of an llmserve module's package (`llmserve.app` is the package `app`)."""
    parts = module.split(".")
    if parts[0] != "llmserve" or len(parts) < 2:
        return None
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), None)


def upward_imports(root: Path = ROOT) -> list[str]:
    """Every import of an llmserve package from one in the same or a higher layer (other than
    its own package), as 'importer -> imported'."""
    modules = project_modules(root, PACKAGES)
    found = []
    for name, path in modules.items():
        own = layer_of(name)
        for imported in imports_of(path, root):
            theirs = layer_of(imported)
            if theirs is None or imported.split(".")[:2] == name.split(".")[:2]:
                continue
            if own is None or theirs >= own:
                found.append(f"{name} -> {imported}")
    return sorted(found)


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


def test_every_package_is_in_a_layer_and_imports_only_lower_ones():
    packages = {p.name for p in (ROOT / "llmserve").iterdir() if (p / "__init__.py").exists()}
    assert packages | {"app"} == set().union(*LAYERS), "a package of no layer, or a layer of none"
    assert upward_imports() == []


def test_the_layer_checker_catches_an_upward_import(tmp_path):
    for package, source in (("config", "from llmserve.router import router\n"), ("router", "")):
        (tmp_path / "llmserve" / package).mkdir(parents=True)
        (tmp_path / "llmserve" / package / "__init__.py").write_text("")
        (tmp_path / "llmserve" / package / "m.py").write_text(source)
    (tmp_path / "llmserve" / "__init__.py").write_text("")
    assert upward_imports(tmp_path) == [
        "llmserve.config.m -> llmserve.router",
        "llmserve.config.m -> llmserve.router.router",
    ]


def test_only_the_engine_module_imports_vllm_or_torch():
    for name, path in project_modules().items():
        heavy = {n.split(".")[0] for n in imports_of(path)} & ENGINE_ONLY
        assert not heavy or name in HEAVY_MODULES, (name, heavy)


def test_the_checker_catches_a_policy_that_imports_ray(tmp_path):
    """The purity check fails when a policy imports ray, also through a helper module."""
    policies = tmp_path / "llmserve" / "policies"
    policies.mkdir(parents=True)
    (tmp_path / "llmserve" / "__init__.py").write_text("")
    (policies / "__init__.py").write_text("")
    (tmp_path / "llmserve" / "helper.py").write_text("import ray\n")
    (policies / "clean.py").write_text("import math\n")
    (policies / "sneaky.py").write_text("from llmserve import helper\n")
    (policies / "autoscaling.py").write_text("from ray import serve\n")
    found = forbidden_in_policies(tmp_path)
    assert set(found) == {"llmserve.policies.sneaky", "llmserve.policies.autoscaling"}, found
    assert any("ray" in f for f in found["llmserve.policies.sneaky"])
