"""What a model's weights take: its shape read from a Hugging Face config dict, its parameter
count, and the bytes its weights need under each weight scheme (fp16/bf16, int8, int4, fp8).

Pure arithmetic over the config dict (`ModelShape.from_hf_config`); only `load_hf_config` touches
the disk. llmserve/planning/memory_plan.py sets these figures against a device's memory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Model types whose layer layout this module has been checked against (Llama-style decoders).
DENSE_DECODERS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class MemoryPlanError(ValueError):
    """A config this planner cannot use; the message names the field or the file."""


@dataclass(frozen=True)
class WeightScheme:
    """How the weights of the transformer layers' linear projections are stored.

    Embeddings, lm_head, norms and biases stay in the model dtype under every scheme: vLLM's
    AWQ/GPTQ/FP8/INT8 kernels replace the linear layers only.
    """

    name: str
    weight_bits: int  # 16 = unquantized (the model dtype)
    group_size: int | None = None  # None: one scale per output channel (or per tensor, below)
    per_tensor_scale: bool = False
    scale_bytes: int = 0  # per scale
    zero_point_bits: int = 0  # per group (AWQ/GPTQ pack 4-bit zeros)
    description: str = ""


def scheme(name: str, group_size: int = 128) -> WeightScheme:
    """The schemes the planner compares: fp16 (or bf16), int8, int4 (with `group_size`), fp8."""
    if name in ("fp16", "bf16"):
        return WeightScheme(name, 16, description="16-bit weights (fp16/bf16)")
    if name == "int8":
        # W8A8 (compressed-tensors, SmoothQuant) and W8A16 store the same weights: int8 with one
        # fp32 scale per output channel. They differ in the activations, not in memory.
        return WeightScheme("int8", 8, scale_bytes=4, description="int8, per-channel fp32 scales")
    if name == "int4":
        if group_size <= 0:
            raise MemoryPlanError(f"group size must be positive, got {group_size}")
        # AWQ / GPTQ W4A16: each group of `group_size` input weights of an output channel has
        # an fp16 scale and a 4-bit zero point (packed 8 to an int32): 20 extra bits per group.
        return WeightScheme(
            "int4",
            4,
            group_size=group_size,
            scale_bytes=2,
            zero_point_bits=4,
            description=f"int4 W4A16 (AWQ/GPTQ), group {group_size}, fp16 scale + 4-bit zero",
        )
    if name == "fp8":
        # vLLM's fp8 (online or pre-quantized W8A8 FP8): one fp32 scale per weight tensor.
        return WeightScheme(
            "fp8",
            8,
            per_tensor_scale=True,
            scale_bytes=4,
            description="fp8 e4m3, per-tensor fp32 scale",
        )
    raise MemoryPlanError(f"unknown weight scheme {name!r}; use fp16, bf16, int8, int4 or fp8")


COMPARED_SCHEMES = ("fp16", "int8", "int4", "fp8")


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    model_type: str
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3: an RMSNorm over head_dim on q and on k

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelShape:
        if not isinstance(cfg, dict):
            raise MemoryPlanError("the model config must be a JSON object")
        # Mixture-of-experts and latent attention change both the weight and the KV arithmetic.
        for key in ("num_local_experts", "num_experts", "n_routed_experts"):
            if cfg.get(key):
                raise MemoryPlanError(f"{key}={cfg[key]}: mixture-of-experts is not modelled")
        if cfg.get("kv_lora_rank"):
            raise MemoryPlanError("kv_lora_rank: multi-head latent attention is not modelled")
        missing = [
            k
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "vocab_size",
            )
            if not cfg.get(k)
        ]
        if missing:
            raise MemoryPlanError(f"the model config lacks {', '.join(missing)}")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        # Some configs carry `head_dim: null`; Gemma-like ones a head_dim != hidden / heads.
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        model_type = str(cfg.get("model_type", "unknown"))
        return cls(
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),  # absent: plain MHA
            head_dim=head_dim,
            vocab_size=int(cfg["vocab_size"]),
            # transformers' default is tied, so a config that omits the key means tied.
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            model_type=model_type,
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
        )

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) features of one layer's projections: q, k, v, o, gate, up, down."""
        h, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


@dataclass(frozen=True)
class ParamCount:
    embedding: int
    lm_head: int  # 0 when tied to the embedding
    layer_linear: int  # all layers' projections: what quantization shrinks
    layer_other: int  # norms and biases of all layers, plus the final norm: stay in model dtype

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.layer_linear + self.layer_other

    @property
    def unquantized(self) -> int:
        return self.embedding + self.lm_head + self.layer_other


def count_params(shape: ModelShape) -> ParamCount:
    linear = sum(i * o for i, o in shape.linear_shapes())
    norms = 2 * shape.hidden_size + (2 * shape.head_dim if shape.qk_norm else 0)
    bias = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim if shape.qkv_bias else 0
    embedding = shape.vocab_size * shape.hidden_size
    return ParamCount(
        embedding=embedding,
        lm_head=0 if shape.tie_word_embeddings else embedding,
        layer_linear=shape.num_layers * linear,
        layer_other=shape.num_layers * (norms + bias) + shape.hidden_size,  # + final norm
    )


def _linear_bytes(in_features: int, out_features: int, s: WeightScheme, dtype_bytes: int) -> int:
    if s.weight_bits == 16:
        return in_features * out_features * dtype_bytes
    weights = math.ceil(in_features * out_features * s.weight_bits / 8)
    if s.per_tensor_scale:
        return weights + s.scale_bytes
    groups = math.ceil(in_features / s.group_size) if s.group_size else 1
    per_group_bits = 8 * s.scale_bytes + s.zero_point_bits
    return weights + math.ceil(out_features * groups * per_group_bits / 8)


def weight_bytes(shape: ModelShape, s: WeightScheme, dtype_bytes: int = 2) -> int:
    params = count_params(shape)
    layer = sum(_linear_bytes(i, o, s, dtype_bytes) for i, o in shape.linear_shapes())
    return shape.num_layers * layer + params.unquantized * dtype_bytes


def dtype_bytes_for(dtype: str) -> int:
    """Bytes per weight for vLLM's `dtype`; `auto` serves fp32 checkpoints in 16 bits, like vLLM."""
    return 4 if dtype in ("float32", "float") else 2


def configured_scheme(quantization: str | None, hf_config: dict[str, Any]) -> str | None:
    """The compared scheme a model runs with: engine.quantization, else the checkpoint's own
    `quantization_config` (which vLLM detects by itself). None when it is none of the four."""
    qc = hf_config.get("quantization_config") or {}
    method = (quantization or qc.get("quant_method") or "").lower()
    bits = qc.get("bits") or qc.get("w_bit")
    if not method:
        return "fp16"
    if "fp8" in method:
        return "fp8"
    if method.startswith(("awq", "gptq", "marlin")):
        return "int8" if bits == 8 else "int4"
    if method == "bitsandbytes":
        return "int8" if qc.get("load_in_8bit") else "int4"
    if method == "compressed-tensors":  # what `quantize:` and llm-compressor write
        weights = _compressed_tensors_weights(qc)
        kind, bits = weights.get("type"), weights.get("num_bits")
        if kind == "float" and bits == 8:
            return "fp8"
        if kind == "int" and bits in (4, 8):
            return f"int{bits}"
    return None


def _compressed_tensors_weights(qc: dict[str, Any]) -> dict[str, Any]:
    """The weights' quantization args of a compressed-tensors config (its first group: the
    schemes compared here quantize every Linear layer alike)."""
    groups = list((qc.get("config_groups") or {}).values())
    return (groups[0].get("weights") or {}) if groups else {}


def group_size_of(hf_config: dict[str, Any], default: int = 128) -> int:
    qc = hf_config.get("quantization_config") or {}
    g = (
        qc.get("group_size")
        or qc.get("q_group_size")
        or _compressed_tensors_weights(qc).get("group_size")
    )
    return int(g) if isinstance(g, int) and g > 0 else default


def load_hf_config(path: Path) -> dict[str, Any]:
    """A model's config.json (or its folder's), with errors that name the file."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise MemoryPlanError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MemoryPlanError(f"{path} cannot be read as JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise MemoryPlanError(f"{path} is not a JSON object")
    return cfg


def _human_count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def describe_params(c: ParamCount) -> str:
    head = "tied" if c.lm_head == 0 else _human_count(c.lm_head)
    return (
        f"{_human_count(c.total)} params: embeddings {_human_count(c.embedding)}, "
        f"lm_head {head}, layers {_human_count(c.layer_linear + c.layer_other)}"
    )
