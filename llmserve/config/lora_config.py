"""LoRA adapters of a model: the names clients send as `model`, served by the base model's engines.

An adapter is a name a tenant may use (its `models` list names adapters as it names models) and,
optionally, a list of the tenants that may use it. Every replica of the base model loads the
adapters of its `lora:` section when its engine starts (vLLM's `--lora-modules`), and those of its
deployment's `user_config` (`RuntimeAdapters`) while it runs: a change there reaches the running
engines (vLLM's runtime adapter loading), where a change of the app's `args` restarts every
replica (Serve's code version of an app hashes its args). Where each is on a node:
llmserve/planning/adapters.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pydantic import Field, field_validator, model_validator

from llmserve.config.strict import Strict, checked_model_name

RANDOM_SOURCE = "random:"  # `random:SEED`: a test adapter of random weights (planning/adapters.py)


class AdapterConfig(Strict):
    name: str = Field(description="The `model` value clients send to use this adapter.")
    source: str = Field(
        description="A local folder in PEFT's layout (adapter_config.json and "
        "adapter_model.safetensors), as every replica's node sees it; `pypi:PACKAGE`, an "
        "installed package whose folder holds them; a hub id (`org/name`, vLLM downloads it); "
        "or `random:SEED`, a rank-8 adapter of random weights that `llmserve prepare` builds "
        "(tests, demos)."
    )
    tenants: list[str] | None = Field(
        default=None,
        description="The tenants that may use it, they alone; a tenant with a `models` list "
        "needs the adapter or its base model in it. None: any tenant whose list (if any) "
        "names the adapter.",
    )

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return checked_model_name("adapter", v)

    @field_validator("source")
    @classmethod
    def _source_ok(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("adapter source must not be empty")
        if v.startswith(RANDOM_SOURCE) and not v.removeprefix(RANDOM_SOURCE).isdigit():
            raise ValueError(f"adapter source {v!r}: random:SEED takes a whole number")
        return v


class LoraConfig(Strict):
    """vLLM's LoRA limits for the model's engines, and its adapters."""

    max_loras: int = Field(
        default=1, gt=0, description="Adapters one engine step may mix (vLLM's --max-loras)."
    )
    max_lora_rank: int = Field(
        default=16, gt=0, description="The highest rank among the adapters (--max-lora-rank)."
    )
    max_cpu_loras: int | None = Field(
        default=None,
        gt=0,
        description="Adapters an engine keeps loaded in host memory (--max-cpu-loras; vLLM's "
        "default: max_loras).",
    )
    adapters: list[AdapterConfig] = Field(
        default_factory=list,
        description="Adapters every engine registers when it starts; more may come at runtime "
        "(RuntimeAdapters).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> LoraConfig:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"lora.max_cpu_loras ({self.max_cpu_loras}) must be at least lora.max_loras "
                f"({self.max_loras})"
            )
        return self

    def engine_kwargs(self) -> dict:
        return {
            "enable_lora": True,
            "max_loras": self.max_loras,
            "max_lora_rank": self.max_lora_rank,
            "max_cpu_loras": self.max_cpu_loras,
        }


class RuntimeAdapters(Strict):
    """A model deployment's `user_config` in serve_config.yaml (`deployments: - name: llm-MODEL,
    user_config: {adapters: [...]}`): adapters its running replicas load or drop without a
    restart. The model must have a `lora:` section (its engines start with LoRA on)."""

    adapters: list[AdapterConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> RuntimeAdapters:
        names = [a.name for a in self.adapters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"user_config adapters: {', '.join(twice)} named twice")
        return self

    def checked_for(self, model: _Model) -> RuntimeAdapters:
        """Self, or ValueError where `model` cannot take these adapters."""
        if self.adapters and model.lora is None:
            raise ValueError(
                f"model {model.name!r}: user_config adapters need its engines started with "
                "LoRA on: give the model a `lora:` section (max_loras, max_lora_rank)"
            )
        taken = {model.name, *(a.name for a in (model.lora.adapters if model.lora else []))}
        clash = sorted(taken & {a.name for a in self.adapters})
        if clash:
            raise ValueError(
                f"model {model.name!r}: user_config adapters {', '.join(clash)} already named "
                "in its args (the model or its lora.adapters)"
            )
        return self


class _Model(Protocol):
    name: str
    lora: LoraConfig | None


def served_names(models: Iterable[_Model]) -> dict[str, str]:
    """Every name a client may send as `model` -> the model whose engines serve it (a model's
    own name, or one of its adapters'); raises ValueError on a name given twice."""
    out: dict[str, str] = {}
    for m in models:
        for name in [m.name, *(a.name for a in (m.lora.adapters if m.lora else []))]:
            if name in out:
                raise ValueError(f"model or adapter name {name!r} appears twice")
            out[name] = m.name
    return out
