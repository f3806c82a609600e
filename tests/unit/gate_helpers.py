"""Shared by the Gate's unit tests: a Gate over a small AppConfig with a fake clock that tests
move by hand; queued requests are asyncio tasks and `settle()` lets their futures resolve."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.config.app_config import AppConfig, TenantConfig
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.router.admission_gate import Gate

MODEL = "m"


class FakeClock:
    """A plain mutable float, read by the gate through __call__."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def make_gate(
    *tenants: dict,
    max_ongoing_requests: int = 1,
    num_replicas: int = 1,
    num_router_replicas: int = 1,
    clock: FakeClock | None = None,
    max_num_seqs: int = 64,
    **admission,
) -> tuple[Gate, dict[str, TenantConfig], FakeClock]:
    tenants = tenants or ({"name": "t"},)
    config = AppConfig.model_validate(
        {
            "models": [
                {
                    "name": MODEL,
                    "source": "org/m",
                    "engine": {"max_num_seqs": max_num_seqs},
                    "deployment": {
                        "num_replicas": num_replicas,
                        "max_ongoing_requests": max_ongoing_requests,
                    },
                }
            ],
            "tenants": list(tenants),
            "admission": {
                "anonymous_tenant": None,
                "max_queue_len": 8,
                "max_queue_wait_s": 30.0,
                "ageing_s": 0,
                **admission,
            },
        }
    )
    clock = clock or FakeClock()
    gate = Gate(config, config.tenants, num_router_replicas, clock=clock)
    return gate, {t.name: t for t in config.tenants}, clock


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def spawn(gate: Gate, tenant: TenantConfig, *, num_tokens: int = 10, timeout_s: float = 60.0):
    return asyncio.create_task(gate.admit(tenant, MODEL, num_tokens, timeout_s))


def state(gate: Gate) -> tuple[int, int]:
    s = gate.snapshot()[MODEL]
    return s["in_flight"], s["queued"]


def assert_idle(gate: Gate) -> None:
    assert state(gate) == (0, 0), gate.snapshot()


async def refused(awaitable) -> OpenAIError:
    with pytest.raises(OpenAIError) as e:
        await awaitable
    return e.value


def remaining(gate: Gate, tenant: TenantConfig, kind: str) -> int:
    return int(gate.rate_headers(tenant)[f"x-ratelimit-remaining-{kind}"])


TENANTS = (
    {"name": "inter", "priority": "interactive"},
    {"name": "std", "priority": "standard"},
    {"name": "batch", "priority": "batch"},
)


# A tenant with every rate limit low enough to hit in a test.
LIMITED = {
    "name": "t",
    "rate_limits": {"requests_per_s": 1, "max_burst_requests": 2, "tokens_per_min": 600},
}
