"""`quantize:` on a model: checks, the cache folder it prepares, and the real quantizer's output.

The preparation tests swap the quantizer and the GGUF converter for fakes that write a small
folder (milliseconds); the last tests run the real compressed-tensors quantization on a tiny
random Llama and read back what vLLM would load.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from llmserve.config.app_config import ModelConfig
from llmserve.planning import model_source, quantize
from llmserve.planning.model_source import MARKER, ModelSourceError, check, resolve

QUANTIZER = f"compressed-tensors {importlib.metadata.version('compressed-tensors')}"


def write_fake_model(folder: Path, *, config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    save_file({"w": np.ones((4, 4), np.float32)}, str(folder / "model.safetensors"))
    (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.fixture
def fake_quantizer(monkeypatch):
    """Replaces the real quantizer; records (base folder, scheme) per call."""
    calls: list[tuple[Path, str]] = []

    def fake(base: Path, out: Path, scheme: str) -> None:
        calls.append((base, scheme))
        write_fake_model(
            out,
            config={
                "model_type": "llama",
                "quantization_config": {"quant_method": "compressed-tensors", "scheme": scheme},
            },
        )

    monkeypatch.setattr(quantize, "quantize_folder", fake)
    return calls


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """An installed package holding one GGUF, and a converter that only writes a fake model."""
    pkg = tmp_path / "site" / "llmserve_fake_q"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (pkg / "m.Q4_1.gguf").write_bytes(b"GGUF" * 8)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    conversions: list[Path] = []

    def convert(gguf: Path, out: Path, *, progress: bool) -> None:
        conversions.append(out)
        write_fake_model(out)

    monkeypatch.setattr(model_source, "_convert_gguf", convert)
    return conversions


def _quantized_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["quantization_config"]


# ------------------------------------------------------------------------------ checks


def test_a_hub_source_cannot_be_quantized_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = ModelConfig(name="hub-int8", source="org/some-model", quantize="w8a8")
    with pytest.raises(ModelSourceError) as ei:
        check(model, tmp_path)
    message = str(ei.value)
    assert "'hub-int8'" in message and "pypi:" in message and "Fix: download" in message


def test_an_already_quantized_folder_is_not_quantized_again(tmp_path):
    base = write_fake_model(
        tmp_path / "awq",
        config={"model_type": "llama", "quantization_config": {"quant_method": "awq"}},
    )
    model = ModelConfig(name="twice", source=str(base), quantize="w4a16")
    with pytest.raises(ModelSourceError, match=r"'twice'.*already quantized.*drop `quantize`"):
        check(model, tmp_path / "cache")


# ------------------------------------------------------------------- preparing a local base


def test_a_local_base_is_quantized_once_into_the_cache(tmp_path, fake_quantizer):
    base = write_fake_model(tmp_path / "base")
    model = ModelConfig(name="local-int8", source=str(base), quantize="w8a8")
    cache = tmp_path / "cache"
    path = Path(resolve(model, cache))
    assert path == cache / "local-int8"
    assert _quantized_config(path)["quant_method"] == "compressed-tensors"
    assert fake_quantizer == [(base, "w8a8")]
    marker = json.loads((path / MARKER).read_text())
    assert marker["quantize"] == "w8a8" and marker["base"] == str(base.resolve())
    assert resolve(model, cache) == str(path)  # prepared: not quantized again
    assert len(fake_quantizer) == 1
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == ["local-int8"]


def test_a_changed_base_or_scheme_is_quantized_again(tmp_path, fake_quantizer):
    base = write_fake_model(tmp_path / "base")
    cache = tmp_path / "cache"
    resolve(ModelConfig(name="v", source=str(base), quantize="w8a8"), cache)
    weights = base / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    resolve(ModelConfig(name="v", source=str(base), quantize="w8a8"), cache)
    resolve(ModelConfig(name="v", source=str(base), quantize="w4a16"), cache)
    assert [scheme for _, scheme in fake_quantizer] == ["w8a8", "w8a8", "w4a16"]
    assert _quantized_config(cache / "v")["scheme"] == "w4a16"


def test_a_failed_quantization_leaves_nothing_behind_and_names_the_model(tmp_path, monkeypatch):
    def broken(base, out, scheme):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(quantize, "quantize_folder", broken)
    base = write_fake_model(tmp_path / "base")
    cache = tmp_path / "cache"
    with pytest.raises(ModelSourceError, match=r"model 'v4'.*out of memory.*Fix:"):
        resolve(ModelConfig(name="v4", source=str(base), quantize="w4a16"), cache)
    assert [p.name for p in cache.iterdir()] == [".v4.lock"]  # no folder, no temporary left


# --------------------------------------------------------------------- preparing a pypi base


def test_a_pypi_base_reuses_the_plain_conversion_already_in_the_cache(
    tmp_path, fake_package, fake_quantizer
):
    cache = tmp_path / "cache"
    plain = Path(resolve(ModelConfig(name="bf16", source="pypi:llmserve-fake-q"), cache))
    assert len(fake_package) == 1
    resolve(ModelConfig(name="int8", source="pypi:llmserve-fake-q", quantize="w8a8"), cache)
    resolve(ModelConfig(name="int4", source="pypi:llmserve-fake-q", quantize="w4a16"), cache)
    assert len(fake_package) == 1  # the GGUF was converted once, for the bf16 model
    assert fake_quantizer == [(plain, "w8a8"), (plain, "w4a16")]
    marker = json.loads((cache / "int4" / MARKER).read_text())
    assert marker == {
        "gguf_name": "m.Q4_1.gguf",
        "gguf_size": 32,
        "quantize": "w4a16",
        "preset": "W4A16",
        "group_size": 32,
        "quantizer": QUANTIZER,
    }


def test_another_quantizer_version_rebuilds_the_variant(
    tmp_path, fake_package, fake_quantizer, monkeypatch
):
    cache = tmp_path / "cache"
    model = ModelConfig(name="int8", source="pypi:llmserve-fake-q", quantize="w8a8")
    first = resolve(model, cache)
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "99.0" if name == "compressed-tensors" else real_version(name),
    )
    assert resolve(model, cache) == first
    assert len(fake_quantizer) == 2  # quantized again, into the same folder
    assert json.loads((Path(first) / MARKER).read_text())["quantizer"] == "compressed-tensors 99.0"


def test_a_pypi_base_alone_is_converted_into_a_temporary_folder(
    tmp_path, fake_package, fake_quantizer
):
    cache = tmp_path / "cache"
    path = resolve(ModelConfig(name="int8", source="pypi:llmserve-fake-q", quantize="w8a8"), cache)
    assert len(fake_package) == 1 and fake_quantizer[0][0] == fake_package[0]
    assert not fake_package[0].exists()  # the intermediate bf16 folder is gone
    assert sorted(p.name for p in cache.iterdir()) == [".int8.lock", "int8"]
    assert _quantized_config(Path(path))["scheme"] == "w8a8"


# -------------------------------------------------------------------- the real quantizer


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A random 2-layer Llama (hidden 64) with a small word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "hello", "world"])}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_w8a8_writes_int8_weights_with_per_channel_scales_vllm_can_read(tiny_llama, tmp_path):
    import torch

    out = tmp_path / "w8a8"
    out.mkdir()
    quantize.quantize_folder(tiny_llama, out, "w8a8")
    qc = _quantized_config(out)
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "int-quantized"
    group = qc["config_groups"]["group_0"]
    assert group["weights"]["num_bits"] == 8 and group["weights"]["strategy"] == "channel"
    assert group["input_activations"]["dynamic"] is True
    assert group["input_activations"]["strategy"] == "token"
    assert qc["ignore"] == ["lm_head"]

    q, base = _tensors(out), _tensors(tiny_llama)
    name = "model.layers.0.mlp.down_proj"
    assert q[f"{name}.weight"].dtype == torch.int8
    scale = q[f"{name}.weight_scale"].float()
    assert scale.shape == (64, 1)
    # Round to nearest: every weight is within half a step of its dequantized value.
    error = (q[f"{name}.weight"].float() * scale - base[f"{name}.weight"].float()).abs()
    assert bool((error <= scale * 0.5001).all())
    assert q["model.embed_tokens.weight"].dtype == torch.bfloat16  # left in full precision
    for extra in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / extra).exists()


def test_w4a16_packs_int4_weights_in_groups_of_32(tiny_llama, tmp_path):
    import torch

    out = tmp_path / "w4a16"
    out.mkdir()
    quantize.quantize_folder(tiny_llama, out, "w4a16")
    qc = _quantized_config(out)
    assert qc["format"] == "pack-quantized"
    weights = qc["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 32, True)
    q = _tensors(out)
    name = "model.layers.1.mlp.down_proj"  # 128 inputs -> 64 outputs
    assert q[f"{name}.weight_packed"].dtype == torch.int32
    assert q[f"{name}.weight_packed"].shape == (64, 128 // 8)  # eight 4-bit values per int32
    assert q[f"{name}.weight_scale"].shape == (64, 128 // 32)
    assert q[f"{name}.weight_shape"].tolist() == [64, 128]


def test_a_group_size_that_does_not_divide_the_inputs_is_refused(tiny_llama, tmp_path, monkeypatch):
    from llmserve.config import quantization

    odd = quantization.OFFLINE_SCHEMES["w4a16"].__class__(
        "W4A16", 48, "", quantization.OFFLINE_SCHEMES["w4a16"].support
    )
    monkeypatch.setitem(quantization.OFFLINE_SCHEMES, "w4a16", odd)
    out = tmp_path / "odd"
    out.mkdir()
    with pytest.raises(ValueError, match="input size 64 is not a multiple of group size 48"):
        quantize.quantize_folder(tiny_llama, out, "w4a16")
