"""The chaos suite's arithmetic (chaos/): recovery judgement, failure accounting, memory trend.
No Ray cluster: samples and results are made up here."""

from __future__ import annotations

import asyncio
import subprocess
import time

import httpx
import psutil
import pytest

from chaos.fault import fault_figures
from chaos.figures import ok_rate
from chaos.load import Result, _error_code
from chaos.procs import add_engine, replica_of
from chaos.scenarios.soak import _slope, memory_figures
from chaos.watch import Sample, at_capacity


def _sample(states, ids):
    return Sample(0.0, {"llm-m": states}, {"llm-m": set(ids)})


@pytest.mark.parametrize(
    "states, ids, expected",
    [
        ({"RUNNING": 2}, {"a", "b"}, False),  # the victim "a" still listed
        ({"RUNNING": 2}, {"b"}, False),  # Serve has not noticed yet: stale RUNNING count
        ({"RUNNING": 1, "STARTING": 1}, {"b", "c"}, False),  # replacement still starting
        ({"RUNNING": 2}, {"b", "c"}, True),  # replacement running, victim gone
    ],
)
def test_capacity_is_back_only_when_the_replacement_runs(states, ids, expected):
    assert at_capacity(_sample(states, ids), "llm-m", 2, gone={"a"}) is expected


def _r(start, end, outcome="ok", clean=True):
    return Result("m", False, start, end, outcome, 200 if outcome == "ok" else 503, clean)


def test_fault_figures_separate_in_flight_failures_from_later_ones():
    results = [
        _r(0, 1),
        _r(4, 6, "http_error"),
        _r(4.5, 5.5, "sse_error"),
        _r(6, 7, "http_error", clean=False),
        _r(9, 10),
    ]
    f = fault_figures(results, t0=0.0, t_fault=5.0, t_noticed=5.5, t_back=8.0, t_stop=12.0)
    assert f["in_flight_at_fault"] == 2
    assert f["failed"] == 3 and f["failed_in_flight_at_fault"] == 2
    assert f["failed_started_after_fault"] == 1 and f["unclean_failures"] == 1
    assert f["capacity_back_s"] == 3.0 and f["serve_noticed_s"] == 0.5
    assert f["failed_by_outcome"] == {"http_error_503": 2, "sse_error_503": 1}


def test_ok_rate_counts_successes_finished_in_the_window():
    results = [_r(0, 1), _r(0, 2), _r(0, 2.5, "http_error"), _r(0, 3)]
    assert ok_rate(results, 1.5, 3.5) == pytest.approx(1.0)
    assert ok_rate(results, 3, 3) == 0.0


def test_error_bodies_are_clean_only_when_openai_shaped():
    assert _error_code(b'{"error": {"message": "busy", "code": "queue_full"}}') == (
        "queue_full",
        True,
    )
    assert _error_code(b"Internal Server Error") == ("Internal Server Error", False)


def test_memory_trend_and_growth():
    samples = [(0.0, {"p": 100.0, "q": 50.0}), (30.0, {"p": 110.0}), (60.0, {"p": 120.0})]
    m = memory_figures(samples)
    assert m["p"]["growth"] == 20.0 and m["p"]["growth_pct"] == 20.0
    assert m["p"]["trend_mb_per_min"] == pytest.approx(20.0)
    assert m["q"]["alive_to_the_end"] is False
    assert _slope([(0.0, 5.0)]) == 0.0


@pytest.mark.parametrize(
    "title, deployment",
    [
        ("ray::ServeReplica:chaos:Router", "Router"),
        ("ray::ServeReplica:chaos:llm-sim-model.handle_request_streaming", "llm-sim-model"),
        ("ray::ServeReplica:chaos:llm-qwen2.5", "llm-qwen2.5"),
        ("ray::ServeReplica:other:Router", None),
        ("ray::ProxyActor", None),
    ],
)
def test_replica_processes_are_known_by_their_title(title, deployment):
    assert replica_of(title, "chaos") == deployment


def test_the_engine_and_its_worker_are_named_under_their_replica_whatever_their_titles():
    # An "engine" titled "sh -c ...", with one child, its "worker", titled "sleep 30".
    engine = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        while not psutil.Process(engine.pid).children():
            time.sleep(0.01)
        worker = psutil.Process(engine.pid).children()[0].pid
        procs = {"proxy": psutil.Process(1), "llm-m[7]": psutil.Process()}
        assert add_engine(procs, engine.pid) == f"llm-m[7]/EngineCore[{engine.pid}]"
        assert {role: p.pid for role, p in procs.items() if role.startswith("llm-m[7]/")} == {
            f"llm-m[7]/EngineCore[{engine.pid}]": engine.pid,
            f"llm-m[7]/Worker[{worker}]": worker,
        }
        assert add_engine({"llm-m[7]": psutil.Process()}, 1) is None  # not below the replica
    finally:
        for p in psutil.Process(engine.pid).children():
            p.kill()
        engine.kill()
        engine.wait()


@pytest.mark.parametrize(
    "body, outcome, clean",
    [
        (
            b'data: {"choices":[{"text":"a","finish_reason":"length"}]}\n\ndata: [DONE]\n\n',
            "ok",
            True,
        ),
        # vLLM's own end of a failed stream: an error chunk, then [DONE] (the OpenAI SDK raises).
        (
            b'data: {"choices":[{"text":"a"}]}\n\n'
            b'data: {"error":{"message":"engine dead","type":"InternalServerError","code":500}}\n\n'
            b"data: [DONE]\n\n",
            "sse_error",
            True,
        ),
        # The Router's: an `error` event, then [DONE].
        (
            b'data: {"choices":[{"text":"a"}]}\n\nevent: error\n'
            b'data: {"error":{"message":"failed","code":"engine_error"}}\n\ndata: [DONE]\n\n',
            "sse_error",
            True,
        ),
        (b'data: {"choices":[{"text":"a"}]}\n\n', "truncated", False),  # cut: no [DONE]
    ],
)
def test_a_stream_is_judged_as_an_openai_client_reads_it(body, outcome, clean):
    r = _judged(True, lambda request: httpx.Response(200, content=body, headers=REPLICA))
    assert (r.outcome, r.clean, r.replica) == (outcome, clean, "r1"), r


REPLICA = {"x-replica": "r1"}


def _judged(stream: bool, reply) -> Result:
    """One request of a chaos Load, answered by `reply(request)`."""
    from chaos.load import Load

    load = Load("http://test", "m", num_clients=1, max_tokens=4, deadline_s=5)

    async def one():
        transport = httpx.MockTransport(reply)
        async with httpx.AsyncClient(base_url="http://test", transport=transport) as c:
            load._client = c
            return await load.one(stream=stream)

    return asyncio.run(one())


@pytest.mark.parametrize(
    "status, body, outcome, clean, code",
    [
        (200, b'{"choices":[{"text":"a","finish_reason":"length"}]}', "ok", True, ""),
        (200, b'{"choices":[{"text":"","finish_reason":"length"}]}', "empty", False, "empty"),
        (
            503,
            b'{"error":{"message":"busy","code":"queue_full"}}',
            "http_error",
            True,
            "queue_full",
        ),
        (502, b"Bad Gateway", "http_error", False, "Bad Gateway"),
    ],
)
def test_a_whole_answer_is_judged_by_its_status_and_text(status, body, outcome, clean, code):
    r = _judged(False, lambda request: httpx.Response(status, content=body, headers=REPLICA))
    assert (r.outcome, r.clean, r.code, r.status, r.replica) == (outcome, clean, code, status, "r1")
    assert r.start_s <= r.end_s


@pytest.mark.parametrize(
    "error, outcome",
    [(httpx.RemoteProtocolError, "truncated"), (httpx.ConnectError, "transport_error")],
)
def test_a_transport_error_is_a_truncation_or_no_answer(error, outcome):
    def fail(request):
        raise error("gone", request=request)

    r = _judged(True, fail)
    assert (r.outcome, r.clean, r.code, r.status) == (outcome, False, error.__name__, None)


def test_a_fault_lasts_until_the_killed_process_is_gone():
    """A kill is a signal: requests sent between it and the process's exit still reach the
    victim; they count as in flight at the fault, and only later ones as started after it."""
    results = [
        _r(4, 5.02, "http_error"),  # running at the kill
        _r(5.01, 5.03, "http_error", clean=False),  # sent after the kill, before the exit
        _r(5.06, 5.5, "http_error"),  # sent after the exit: should have gone elsewhere
        _r(5.2, 6),
    ]
    f = fault_figures(results, 0.0, 5.0, t_noticed=5.5, t_back=8.0, t_stop=12.0, t_dead=5.05)
    assert f["fault_took_s"] == 0.05
    assert f["in_flight_at_fault"] == 2 and f["failed_in_flight_at_fault"] == 2
    assert f["failed_started_after_fault"] == 1
    # How long the broken requests waited, from the kill and from the exit.
    assert (f["last_failure_answered_s"], f["last_failure_after_death_s"]) == (0.5, 0.45)
