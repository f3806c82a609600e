"""Who may call and how much (tenants, their keys and limits), and the queue's bounds: the
`tenants:` and `admission:` blocks of the app's arguments. Pure data, like
llmserve/config/app_config.py, which re-exports these classes."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from llmserve.config.strict import MODEL_NAME_RE, Strict

HEX_DIGEST_RE = re.compile(r"^[0-9a-fA-F]{64}$")


class RateLimits(Strict):
    """Token buckets of one tenant, for the whole app (split across Router replicas)."""

    requests_per_s: float | None = Field(default=None, gt=0)
    max_burst_requests: int | None = Field(default=None, gt=0)
    # Prompt + max_tokens are reserved at admission and corrected to actual usage at the end.
    tokens_per_min: float | None = Field(default=None, gt=0)


class TenantConfig(Strict):
    name: str
    api_keys: list[str] = Field(
        default_factory=list,
        repr=False,  # a logged config must not leak keys
        description="Inline keys, for tests: build_app turns them into digests before any "
        "deployment sees them. Config files use api_key_env or api_key_sha256.",
    )
    api_key_env: list[str] = Field(
        default_factory=list,
        description="Names of environment variables holding keys (a Kubernetes Secret): read "
        "by the Router in its own process, so the keys are in no config Serve stores.",
    )
    api_key_sha256: list[str] = Field(
        default_factory=list,
        description="SHA-256 digests (hex) of keys: a key that may sit in a config file, "
        "because the file does not hold the key.",
    )
    priority: str = "standard"
    rate_limits: RateLimits = Field(default_factory=RateLimits)
    max_concurrent_requests: int | None = Field(default=None, gt=0)
    default_timeout_s: float = Field(default=60.0, gt=0)
    max_timeout_s: float = Field(default=300.0, gt=0)
    max_tokens_cap: int | None = Field(default=None, gt=0)
    max_tokens_over_cap: Literal["clamp", "reject"] = "clamp"
    models: list[str] | None = Field(default=None, description="Allowed models; None = all.")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not MODEL_NAME_RE.fullmatch(v):
            raise ValueError(f"tenant name {v!r} must be letters, digits, '.', '_', ':' or '-'")
        return v

    @field_validator("api_keys")
    @classmethod
    def _keys_ok(cls, v: list[str]) -> list[str]:
        if any(len(k) < 8 for k in v):
            raise ValueError("API keys must be at least 8 characters")
        return v

    @field_validator("api_key_sha256")
    @classmethod
    def _digests_ok(cls, v: list[str]) -> list[str]:
        if any(not HEX_DIGEST_RE.fullmatch(d) for d in v):
            raise ValueError(
                "api_key_sha256 entries are 64 hex digits: `printf %s KEY | sha256sum`"
            )
        return [d.lower() for d in v]

    @model_validator(mode="after")
    def _timeouts(self) -> TenantConfig:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError(
                f"tenant {self.name!r}: default_timeout_s {self.default_timeout_s} is above "
                f"max_timeout_s {self.max_timeout_s}"
            )
        return self


class AdmissionConfig(Strict):
    priority_levels: dict[str, int] = Field(
        default_factory=lambda: {"interactive": 0, "standard": 1, "batch": 2},
        description="Priority class -> level; lower runs first, in the queue and the engine.",
    )
    max_queue_len: int = Field(default=256, ge=0, description="Per model, per Router replica.")
    max_queue_wait_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="Longest a request may wait in the queue (and refused on arrival when its "
        "expected wait is longer): 503 + Retry-After.",
    )
    max_queue_wait_s_by_class: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = (
        Field(
            default_factory=dict,
            description="Per priority class, instead of max_queue_wait_s: e.g. {batch: 60}, so "
            "that batch work waits its turn while interactive work is refused at once.",
        )
    )
    ttft_objective_s_by_class: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = (
        Field(
            default_factory=dict,
            description="A class's first-token promise: e.g. {interactive: 1, standard: 2}. Each "
            "admitted request of such a class is counted as having met or missed it "
            "(llmserve_ttft_objective_total); a class without one (batch) has only its deadline.",
        )
    )
    adaptive_in_flight: bool = Field(
        default=True,
        description="Each model's in-flight limit starts at its engines' slots (max_num_seqs x "
        "replicas) and moves within the cap (max_ongoing_requests x replicas): streamed "
        "requests that miss their class's first-token objective shrink it, fast first tokens "
        "with the limit full grow it (llmserve/policies/in_flight_limit.py). Without "
        "objectives there is no limit: the cap holds.",
    )
    min_in_flight: int = Field(
        default=4,
        ge=1,
        description="The least the adaptive limit lets in at once, per model and Router replica.",
    )
    ageing_s: float = Field(
        default=20.0, ge=0, description="Queued work gains one level per ageing_s; 0 = off."
    )
    batch_max_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="The lowest class (the largest level: batch) holds at most this share of "
        "a model's engine slots (max_num_seqs x replicas), at least one; the rest stay free for "
        "the other classes, so their requests start at once under a batch flood. 1 = no "
        "reservation (batch may also fill the engines' waiting line).",
    )
    batch_prefill_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Of a model's engine slots, at most this share (at least one) may hold batch "
        "requests still in their prefill (no first token yet): an engine runs the prefills it "
        "admitted before any waiting request, so a wave of batch prefills would delay every "
        "first token behind it. A non-streamed request counts for the mean prefill measured on "
        "streams. 1 = no bound.",
    )
    batch_waits_for_first_tokens: bool = Field(
        default=False,
        description="No batch request starts while a request of a class with a first-token "
        "objective is in its prefill (until its first token, its objective at most): a batch "
        "prefill beside it would share its engine steps and delay its first token.",
    )
    shield_factor: float = Field(
        default=2.0,
        ge=0,
        allow_inf_nan=False,
        description="HAProxy refuses a key's POSTs beyond this many times what its requests "
        "bucket can admit in a second (burst + rate), before they reach a Router: a flood is "
        "shed in C (llmserve/router/shield.py). 0 = off; otherwise at least 2, so that the shield "
        "never refuses what the bucket would admit.",
    )
    anonymous_tenant: str | None = Field(
        default=None,
        description="The tenant of requests that send no key, for a local demo; None (the "
        "default): every request needs a key (401 without). A wrong key is a 401 either way.",
    )

    @field_validator("shield_factor")
    @classmethod
    def _shield_factor_ok(cls, v: float) -> float:
        if 0 < v < 2:
            raise ValueError(f"shield_factor must be 0 (off) or at least 2, got {v}")
        return v

    @model_validator(mode="after")
    def _known_classes(self) -> AdmissionConfig:
        for field in ("max_queue_wait_s_by_class", "ttft_objective_s_by_class"):
            unknown = set(getattr(self, field)) - set(self.priority_levels)
            if unknown:
                raise ValueError(
                    f"{field}: unknown classes {sorted(unknown)}; the classes are "
                    f"{sorted(self.priority_levels)}"
                )
        by_level = self.max_queue_wait_s_by_level()
        for c, bound_s in self.max_queue_wait_s_by_class.items():
            if by_level[self.priority_levels[c]] != bound_s:  # the queue keeps one per level
                raise ValueError(
                    f"max_queue_wait_s_by_class: classes of level {self.priority_levels[c]} "
                    "must have the same bound"
                )
        return self

    def max_queue_wait_s_by_level(self) -> dict[int, float]:
        return {self.priority_levels[c]: s for c, s in self.max_queue_wait_s_by_class.items()}
