"""Tenants: who is calling (API key -> tenant) and what a request of theirs may ask for.

Pure: the environment is passed in, so tests need no monkeypatching. Keys are held only as
SHA-256 digests (the Router is given digests, never keys: AppConfig.for_router), and every
presented key is compared against every stored digest with `hmac.compare_digest`, so neither
the lookup's timing nor a memory dump reveals a key.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping
from dataclasses import dataclass

from llmserve.config.app_config import AppConfig, Served, TenantConfig, key_digest
from llmserve.protocol.openai_protocol import OpenAIError


class TenantDirectory:
    def __init__(self, config: AppConfig, environ: Mapping[str, str]) -> None:
        self._by_name = {t.name: t for t in config.effective_tenants()}
        self._keys: list[tuple[bytes, str]] = []
        for t in config.effective_tenants():
            digests = [key_digest(k) for k in t.api_keys] + list(t.api_key_sha256)
            for var in t.api_key_env:
                value = environ.get(var)
                if not value:
                    raise ValueError(f"tenant {t.name!r}: environment variable {var} is not set")
                digests.append(key_digest(value))
            for d in digests:
                digest = bytes.fromhex(d)
                owner = next((n for k, n in self._keys if k == digest and n != t.name), None)
                if owner is not None:  # the config checks inline keys; env keys land here
                    raise ValueError(
                        f"tenants {owner!r} and {t.name!r}: an API key is given "
                        "to more than one tenant"
                    )
                self._keys.append((digest, t.name))
        anon = config.admission.anonymous_tenant
        self._anonymous = self._by_name.get(anon) if anon else None

    def tenant(self, name: str) -> TenantConfig:
        return self._by_name[name]

    @property
    def anonymous(self) -> TenantConfig | None:
        return self._anonymous

    def key_digests(self) -> list[tuple[str, TenantConfig]]:
        """(SHA-256 hex of a key, its tenant) for every key: digests only, never a key."""
        return [(digest.hex(), self._by_name[name]) for digest, name in self._keys]

    @property
    def tenants(self) -> list[TenantConfig]:
        return list(self._by_name.values())

    def authenticate(self, authorization: str | None) -> TenantConfig:
        """The tenant of an `Authorization: Bearer KEY` header; raises a 401 OpenAIError.

        No key: the anonymous tenant where the config names one (a local demo), else a 401. A
        key that matches no tenant is a 401 whatever the anonymous setting, as OpenAI answers
        it: a client with a typo learns it at once instead of being served with other limits.
        """
        if not authorization:
            if self._anonymous is not None:
                return self._anonymous
            raise OpenAIError(
                401,
                "Missing API key: send `Authorization: Bearer YOUR_KEY`.",
                code="missing_api_key",
            )
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise OpenAIError(
                401,
                "Malformed Authorization header: expected `Bearer YOUR_KEY`.",
                code="invalid_api_key",
            )
        presented = bytes.fromhex(key_digest(key))
        found = None
        for digest, name in self._keys:  # no early exit: same work for every key
            if hmac.compare_digest(presented, digest):
                found = name
        if found is None:
            raise OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return self._by_name[found]

    def optional(self, authorization: str | None) -> TenantConfig | None:
        """The caller's tenant where it has a valid key, else None (no error): for the health
        endpoints, which answer everyone, in less detail without a key."""
        if not authorization:
            return None
        try:
            return self.authenticate(authorization)
        except OpenAIError:
            return None


@dataclass(frozen=True)
class RequestTerms:
    """What a tenant's request may use, decided before it is admitted."""

    max_tokens: int  # the most the engine may generate; what the token bucket reserves
    # What to send the engine: None lets it use the model default clipped to the context left.
    engine_max_tokens: int | None
    max_tokens_clamped_from: int | None  # the asked value when it was clamped to the cap
    timeout_s: float


def model_not_found(model: str) -> OpenAIError:
    """One answer, word for word, for "no such model" and "not one of yours": a tenant learns
    nothing about the models of others by probing names."""
    return OpenAIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def model_not_served(model: str, held_back_reason: str | None) -> OpenAIError:
    """The 404 for a name this Router does not serve: why, where this host holds the model back
    (llmserve/config/host_fit.py) from a tenant that may use it (ServedTable.held_back_reason);
    model_not_found's words otherwise."""
    if held_back_reason is None:
        return model_not_found(model)
    return OpenAIError(404, held_back_reason, param="model", code="model_not_available")


def may_use(tenant: TenantConfig, name: str, served: Served) -> bool:
    """Whether the tenant may send `name` (which `served` serves) as its model: its `models`
    list (if any) names it. An adapter with `tenants` is theirs alone, and naming a tenant is a
    grant of its own where the tenant's list names the adapter's base model: an adapter loaded
    at runtime cannot be in a list written before it existed."""
    listed = tenant.models is None or name in tenant.models
    adapter = served.adapter
    if adapter is None or adapter.tenants is None:
        return listed
    return tenant.name in adapter.tenants and (listed or served.model.name in tenant.models)


def request_terms(
    tenant: TenantConfig,
    max_tokens: int | None,
    timeout_s: float | None,
    default_max_tokens: int,
) -> RequestTerms:
    """The max_tokens cap and deadline for one request (model access: `may_use`); raises
    OpenAIError."""
    if timeout_s is not None and (not math.isfinite(timeout_s) or timeout_s <= 0):
        raise OpenAIError(400, "timeout must be a positive number of seconds", param="timeout")
    timeout = min(timeout_s or tenant.default_timeout_s, tenant.max_timeout_s)
    cap = tenant.max_tokens_cap
    clamped_from = None
    if max_tokens is None:
        if cap is None or default_max_tokens <= cap:
            return RequestTerms(default_max_tokens, None, None, timeout)
        return RequestTerms(cap, cap, None, timeout)
    if cap is not None:
        if max_tokens > cap:
            if tenant.max_tokens_over_cap == "reject":
                raise OpenAIError(
                    400,
                    f"max_tokens {max_tokens} is above your limit of {cap}",
                    param="max_tokens",
                    code="max_tokens_above_limit",
                )
            clamped_from, max_tokens = max_tokens, cap
    return RequestTerms(max_tokens, max_tokens, clamped_from, timeout)


def estimate_prompt_tokens(text_chars: int) -> int:
    """A cheap upper-ish estimate for the token bucket; corrected by actual usage afterwards.

    English BPE averages about 4 characters a token; 3 errs on the side of reserving too much,
    which the settlement at the end gives back.
    """
    return text_chars // 3 + 1
