"""LoRA adapters added while the app runs: the deployment's user_config validated, applied to an
engine (load, drop, keep; a broken one left out, the rest loaded), and the Router's table of
served names asking the replicas for them (the real engine and Serve: tests/integration/
test_runtime_adapters.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmserve.config.app_config import AppConfig
from llmserve.config.lora_config import RuntimeAdapters
from llmserve.replica.runtime_adapters import RuntimeAdapterSet
from llmserve.router import served_table
from llmserve.router.served_table import ServedTable
from llmserve.router.tenancy import may_use


def app(lora: dict | None = None) -> AppConfig:
    return AppConfig(
        models=[
            {
                "name": "base",
                "source": "org/base",
                "lora": lora or {"adapters": [{"name": "base-fixed", "source": "/a/fixed"}]},
            },
            {"name": "plain", "source": "org/plain"},
        ],
        tenants=[{"name": "all"}, {"name": "legal"}],
    )


@pytest.mark.parametrize(
    "model, adapters, words",
    [
        ("base", [{"name": "x", "source": "/a"}, {"name": "x", "source": "/b"}], "x named twice"),
        ("base", [{"name": "base-fixed", "source": "/a"}], "base-fixed already named in its args"),
        ("base", [{"name": "base", "source": "/a"}], "base already named"),
        ("plain", [{"name": "x", "source": "/a"}], "give the model a `lora:` section"),
        ("base", [{"name": "bad name", "source": "/a"}], "adapter name"),
    ],
)
def test_a_wrong_user_config_says_what_is_wrong(model, adapters, words):
    m = next(m for m in app().models if m.name == model)
    with pytest.raises(ValueError, match=words):
        RuntimeAdapters.model_validate({"adapters": adapters}).checked_for(m)


class Engine:
    def __init__(self, broken: set[str] = frozenset()) -> None:
        self.registered: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.broken = broken

    async def load_adapter(self, name: str, path: str) -> None:
        self.calls.append(("load", name))
        if name in self.broken:
            raise ValueError(f"adapter {name!r} ({path}): rank 64 is above max_lora_rank 8")
        self.registered[name] = path

    async def unload_adapter(self, name: str) -> None:
        self.calls.append(("unload", name))
        self.registered.pop(name, None)


def adapter_folder(root: Path, name: str) -> str:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "adapter_config.json").write_text("{}")
    return str(root / name)


async def test_each_change_of_the_user_config_reaches_the_engine(tmp_path):
    engine = Engine(broken={"too-big"})
    replica = RuntimeAdapterSet(engine, app().models[0], "/models/base", tmp_path / "cache")
    a, b = adapter_folder(tmp_path, "a"), adapter_folder(tmp_path, "b")
    await replica.apply({"adapters": [{"name": "ad-a", "source": a}]})
    assert engine.registered == {"ad-a": a} and replica.failed == {}
    assert replica.listed() == [{"name": "ad-a", "source": a, "tenants": None}]

    # One added, one unchanged (not loaded again), one that cannot load, one with no folder.
    await replica.apply(
        {
            "adapters": [
                {"name": "ad-a", "source": a},
                {"name": "ad-b", "source": b, "tenants": ["legal"]},
                {"name": "too-big", "source": a},
                {"name": "nowhere", "source": str(tmp_path / "nowhere")},
            ]
        }
    )
    assert engine.calls == [("load", "ad-a"), ("load", "ad-b"), ("load", "too-big")]
    assert engine.registered == {"ad-a": a, "ad-b": b}
    assert [d["name"] for d in replica.listed()] == ["ad-a", "ad-b"]
    assert "max_lora_rank" in replica.failed["too-big"]
    assert "has no adapter_config.json" in replica.failed["nowhere"]

    # A config that cannot apply changes nothing; the next good one drops what it leaves out.
    engine.calls.clear()
    await replica.apply({"adapters": [{"name": "base-fixed", "source": a}]})
    assert engine.calls == [] and engine.registered == {"ad-a": a, "ad-b": b}
    assert "already named in its args" in replica.failed["user_config"]
    await replica.apply({"adapters": [{"name": "ad-b", "source": a}]})  # moved to a new folder
    assert engine.calls == [("unload", "ad-a"), ("load", "ad-b")]
    assert engine.registered == {"ad-b": a} and replica.failed == {}
    await replica.apply({})
    assert engine.registered == {} and replica.listed() == []


class Replicas:
    """What `served_adapters` answers, per model; counts the calls."""

    def __init__(self) -> None:
        self.adapters: dict[str, list[dict]] = {"base": []}
        self.calls = 0
        self.fail = False
        self.delay_s = 0.0

    async def ask(self, model: str) -> list[dict]:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise TimeoutError("no replica answered")
        return self.adapters[model]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_adapter_added_at_runtime_is_found_on_its_first_request():
    replicas, clock = Replicas(), Clock()
    table = ServedTable(app(), replicas.ask, clock)
    assert (await table.find("base-fixed")).adapter.source == "/a/fixed"
    assert replicas.calls == 0  # an args name needs no call
    assert await table.find("ad-new") is None and replicas.calls == 1

    replicas.adapters["base"] = [{"name": "ad-new", "source": "/x", "tenants": ["legal"]}]
    # A flood of unknown names within FRESH_S costs no further call...
    for _ in range(50):
        assert await table.find("ad-new") is None
    assert replicas.calls == 1
    # ...after it, the first request for the new adapter finds it.
    clock.now += served_table.FRESH_S
    served = await table.find("ad-new")
    assert replicas.calls == 2 and served.model.name == "base"
    tenants = {t.name: t for t in app().tenants}
    assert may_use(tenants["legal"], "ad-new", served)
    assert not may_use(tenants["all"], "ad-new", served)
    assert dict(table.items()).keys() == {"base", "base-fixed", "plain", "ad-new"}

    # Replicas that do not answer keep the last answer; a removal is seen on the next refresh
    # (the Router's loop refreshes every REFRESH_S).
    replicas.fail, clock.now = True, clock.now + served_table.FRESH_S
    assert await table.freshen() and table.get("ad-new") is not None
    replicas.fail, replicas.adapters["base"] = False, []
    clock.now += served_table.FRESH_S
    assert await table.freshen() and await table.find("ad-new") is None


async def test_requests_arriving_during_a_refresh_wait_for_that_one():
    replicas = Replicas()
    replicas.adapters["base"] = [{"name": "ad-new", "source": "/x"}]
    replicas.delay_s = 0.05
    table = ServedTable(app(), replicas.ask, Clock())
    found = await asyncio.gather(*(table.find("ad-new") for _ in range(10)))
    assert all(f is not None and f.model.name == "base" for f in found)
    assert replicas.calls == 1


async def test_an_app_without_lora_never_asks():
    replicas = Replicas()
    no_lora = AppConfig(models=[{"name": "plain", "source": "org/plain"}], tenants=[{"name": "t"}])
    table = ServedTable(no_lora, replicas.ask, Clock())
    assert await table.find("nope") is None and not await table.freshen()
    await asyncio.wait_for(table.run(), 1)  # returns at once
    assert replicas.calls == 0
