"""Offline planning: a model's source prepared into a folder vLLM loads, weights quantized,
and the memory plan (what a model's weights take, how much KV cache fits beside them).
"""
