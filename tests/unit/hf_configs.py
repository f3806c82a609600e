"""The Hugging Face configs the memory-plan tests count: the model cards' own numbers
(tests/unit/test_memory_plan.py and test_memory_plan_weights.py)."""

from __future__ import annotations

from llmserve.planning.weights import ModelShape

# The default model's config.json as `llmserve prepare` writes it (HF SmolLM2-135M-Instruct).
SMOLLM2_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}
# meta-llama/Llama-2-7b-hf's model card / config.json.
LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
# meta-llama/Meta-Llama-3-8B: grouped-query attention (8 KV heads), 128k vocabulary.
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# Qwen/Qwen2-0.5B: biases on q, k, v; tied embeddings; no head_dim key (896 / 14 = 64).
QWEN2_0_5B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def shape(cfg: dict) -> ModelShape:
    return ModelShape.from_hf_config(cfg)
