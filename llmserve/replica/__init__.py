"""The LLMServer replica: one engine per replica behind the engine seam (engine/), vLLM's
argv, and the replica's side of the Responses API's store.
"""
