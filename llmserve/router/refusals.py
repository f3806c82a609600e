"""The gate's refusals as OpenAI-shaped errors: their status, code, words and Retry-After.

One place for what a refused client reads, so that the same refusal reads the same wherever the
gate decides it (admission_gate.py decides; this module only words it).
"""

from __future__ import annotations

import math

from llmserve.config.app_config import TenantConfig
from llmserve.protocol.openai_protocol import OpenAIError

# Why a model could not take a request now (the admission policy's Reject reasons, and the
# gate's own), as the 503's words.
OVERLOADED = {
    "queue_full": "queue is full",
    "queue_timeout": "request waited too long",
    "queue_wait": "expected queue wait is longer than allowed",
    "cold_start": "no replica runs and one takes longer to start than the request may wait",
}


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def rate_limited(tenant: TenantConfig, decision, headers: dict[str, str]) -> OpenAIError:
    return OpenAIError(
        429,
        f"Rate limit reached for {' and '.join(decision.limited_by)} of tenant "
        f"'{tenant.name}'. Retry after {decision.retry_after_s:.2f} s.",
        code="rate_limit_exceeded",
        headers={**headers, "Retry-After": retry_after(decision.retry_after_s)},
    )


def too_large(num_tokens: int, headers: dict[str, str]) -> OpenAIError:
    return OpenAIError(
        400,
        f"this request needs {num_tokens} tokens, more than your limit allows; "
        "lower max_tokens or shorten the prompt",
        param="max_tokens",
        code="request_too_large",
        headers=headers,
    )


def too_concurrent(tenant: TenantConfig, cap: int, headers: dict[str, str]) -> OpenAIError:
    return OpenAIError(
        429,
        f"Too many concurrent requests for tenant '{tenant.name}' (limit {cap}).",
        code="concurrency_limit_exceeded",
        headers={**headers, "Retry-After": "1"},
    )


def overloaded(model: str, reason: str, retry_after_s: float) -> OpenAIError:
    return OpenAIError(
        503,
        f"model '{model}' is overloaded ({OVERLOADED[reason]}); retry after {retry_after_s:.1f} s",
        code=reason,
        headers={"Retry-After": retry_after(retry_after_s)},
    )


def deadline_exceeded(message: str) -> OpenAIError:
    return OpenAIError(504, message, code="deadline_exceeded")
