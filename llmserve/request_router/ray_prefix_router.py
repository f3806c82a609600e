"""Ray Serve LLM's `PrefixCacheAffinityRouter` over this platform's replicas (routing policy
`ray_prefix_affinity`), for comparison with the prefix-aware `llm_aware` router.

Ray's router matches prompt text in a character tree kept in a detached actor, inserts a prompt
after routing it (with a blocking `ray.get`), and never hears of the engine's evictions. It
reads the prompt from the first argument's `.prompt` or `.messages`; ours is a ReplicaRequest
carrying the JSON body, so this adapter parses it. Needs `ray[llm]`.
"""

from __future__ import annotations

import json
from typing import Any

from ray.serve.llm.request_router import PrefixCacheAffinityRouter


class RayPrefixAffinityRouter(PrefixCacheAffinityRouter):
    def _extract_text_from_request(self, pending_request: Any) -> str:
        args = getattr(pending_request, "args", None) or ()
        body = getattr(args[0], "body", b"{}") if args else b"{}"
        try:
            parsed = json.loads(body)
        except ValueError:
            return ""
        if not isinstance(parsed, dict):
            return ""
        prompt = parsed.get("messages", parsed.get("prompt"))
        return self._normalize_prompt_to_string(prompt)
