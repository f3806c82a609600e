"""Data-free (round-to-nearest) quantization of a prepared HF folder into compressed-tensors.

The output is what llm-compressor would write for the same scheme with no calibration data:
config.json carries `quantization_config` (quant_method `compressed-tensors`), the linear layers
hold int8 or fp8 weights (`int-quantized`, `float-quantized`) or int4 weights packed into int32
(`pack-quantized`) with their scales, and vLLM loads it as is. llm-compressor itself is not used:
its current release (0.14) pins an older transformers than vLLM's, and for data-free RTN it only
adds a min/max observer, which is the few lines in `_calibrate_weights` below. The scheme
definitions, the quantize/pack code and the config format all come from `compressed-tensors`, the
library both vLLM and llm-compressor use.

torch, transformers and compressed-tensors are imported inside the functions: model_source imports
this module, and the Router and `llmserve check` import model_source without needing them.
"""

from __future__ import annotations

from pathlib import Path

from llmserve.config.quantization import OFFLINE_SCHEMES

# Left in full precision: lm_head is tied to the embeddings in small models, and quantizing it
# costs the most quality for the least memory (llm-compressor's examples ignore it too).
IGNORE = ["lm_head"]


def quantization_config(scheme_name: str):
    """The compressed_tensors QuantizationConfig of a scheme, all Linear layers but lm_head."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    scheme = OFFLINE_SCHEMES[scheme_name]
    qscheme: QuantizationScheme = preset_name_to_scheme(scheme.preset, ["Linear"])
    if scheme.group_size is not None:
        qscheme.weights = qscheme.weights.model_copy(update={"group_size": scheme.group_size})
    return QuantizationConfig(config_groups={"group_0": qscheme}, ignore=IGNORE)


def quantize_folder(base: Path, out: Path, scheme_name: str) -> None:
    """Writes `scheme_name` applied to the HF model in `base` into the empty folder `out`."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    apply_quantization_config(model, quantization_config(scheme_name))
    _calibrate_weights(model)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)  # quantizes, packs, and drops the bf16 weights
    model.save_pretrained(out, safe_serialization=True)
    compressor.update_config(str(out))  # adds quantization_config to config.json
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    for extra in ("chat_template.jinja", "generation_config.json"):
        if (base / extra).exists() and not (out / extra).exists():
            (out / extra).write_bytes((base / extra).read_bytes())


def _calibrate_weights(model) -> None:
    """Sets each quantized layer's weight scale from its own weights: min/max, no data needed.

    Activations need nothing here: the schemes offered quantize them dynamically (per token, at
    run time) or not at all. Scales are written in float32 (vLLM's int8 kernels keep them so).
    """
    import torch
    from compressed_tensors.quantization import QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams, is_module_quantized

    with torch.no_grad():
        for _, module in model.named_modules():
            if not is_module_quantized(module) or module.quantization_scheme.weights is None:
                continue
            args = module.quantization_scheme.weights
            weight = module.weight.float()
            if args.strategy == QuantizationStrategy.CHANNEL:
                lo = weight.amin(dim=-1, keepdim=True)
                hi = weight.amax(dim=-1, keepdim=True)
            elif args.strategy == QuantizationStrategy.GROUP:
                rows, cols = weight.shape
                if cols % args.group_size:
                    raise ValueError(
                        f"input size {cols} is not a multiple of group size {args.group_size}"
                    )
                grouped = weight.reshape(rows, cols // args.group_size, args.group_size)
                lo, hi = grouped.amin(dim=-1), grouped.amax(dim=-1)
            else:
                lo, hi = weight.amin().reshape(1), weight.amax().reshape(1)
            scale, zero_point = calculate_qparams(lo, hi, args)
            # float32 from here on: with the scale and w / scale in bf16 (8 significant bits),
            # int8 weights landed up to 0.75 of a step from the original instead of 0.5.
            module.weight.data = weight
            module.weight_scale.data = scale.reshape(module.weight_scale.shape)
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(
                    zero_point.reshape(module.weight_zero_point.shape)
                )
