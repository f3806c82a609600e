"""Replica routing on two real replicas of the tiny model: balance, cancellation, LoRA adapters
where their engines hold them, a hung engine, and prefix-aware routing: a conversation's next
turn goes to the replica whose KV cache holds its history, known from the engine's own KV events,
and the engine reports the hit; a killed replica leaves the router's view within seconds.
Routing by load alone would send a follow-up to its replica half of the time: six of six by
chance is one time in 64.

An engine killed under load is the chaos suite's `replica-death-engine` (tests/integration/
test_chaos.py): the same fault on the same two tiny replicas, with more checked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import defaultdict

import httpx
import pytest
import ray
from ray import serve

from chaos.scenarios.replica_death import replica_actor, wait_gone
from llmserve.request_router.prompt_tokens import PromptTokens
from tests.integration.apps import CALL_TIMEOUT_S, ENGINE_READY_S, OPEN_ACCESS, TINY
from tests.integration.helpers import deployed_app, tiny_engine
from tests.integration.pair_load import balance
from tests.integration.prefix_turns import BODIES, NUM_SESSIONS, REPORT_WAIT_S, chat, first_turns

# Each test may wait for engines to start (two, in the first): longer than the default limit.
pytestmark = pytest.mark.timeout(4 * ENGINE_READY_S)

PREFIX = "/routing"
NAME = "tiny-pair"
# Two adapters and room for one in each engine (max_cpu_loras 1): the engines hold different ones.
ADAPTERS = ("pair-lora-a", "pair-lora-b")
POLICIES = ("round_robin", "llm_aware")


def routing_app(model_dirs) -> dict:
    return {
        **OPEN_ACCESS,
        "http": {"debug_headers": True},
        "models": [
            {
                "name": NAME,
                "source": str(model_dirs[TINY]),
                "engine": tiny_engine(32),
                # vLLM's usage then says how many prompt tokens came from its prefix cache.
                "server": {"extra": {"enable_prompt_tokens_details": True}},
                "deployment": {
                    "num_replicas": 2,
                    "max_ongoing_requests": 32,
                    "num_cpus": 0.5,
                    "health_check_period_s": 2,
                    "health_check_timeout_s": 30,
                },
                "routing": {
                    "policy": "llm_aware",
                    "stats_period_s": 0.5,
                    "session_affinity": False,
                },
                # Tight enough to see a hung engine within a minute, loose enough that a healthy
                # one on a loaded CI host still answers its one-token probe; an idle engine is
                # probed every 10 s (the default's 60 s would only slow the hang test down).
                "health": {"probe_timeout_s": 10, "hang_timeout_s": 20, "idle_probe_period_s": 10},
                "lora": {
                    "max_lora_rank": 8,
                    "max_loras": 1,
                    "max_cpu_loras": 1,
                    "adapters": [
                        {"name": name, "source": f"random:{seed}"}
                        for seed, name in enumerate(ADAPTERS, start=1)
                    ],
                },
            }
        ],
    }


def sim_pair_app() -> dict:
    """The same pair of replicas on the simulated engine, once per policy: side by side in one
    app, where the real engines would need a rolling redeploy (two engine starts) per policy."""
    return {
        **OPEN_ACCESS,
        "http": {"debug_headers": True},
        "models": [
            {
                "name": f"sim-{policy}",
                "source": "simulated",
                "engine": {"max_model_len": 1024, "max_num_seqs": 32},
                "simulation": {"step_s": 0.02},
                "deployment": {"num_replicas": 2, "max_ongoing_requests": 32, "num_cpus": 0.25},
                "routing": {"policy": policy, "stats_period_s": 0.5, "session_affinity": False},
            }
            for policy in POLICIES
        ],
    }


@pytest.fixture(scope="module")
def url(serve_cluster, model_dirs):
    with deployed_app(
        serve_cluster, routing_app(model_dirs), "routing", PREFIX, [f"llm-{NAME}"]
    ) as app_url:
        yield app_url


def test_llm_aware_routing_balances_better_than_round_robin(serve_cluster):
    """The policies side by side on simulated replicas: round-robin sends every long request
    of the alternating load to one replica; the LLM-aware router spreads them."""
    deployments = [f"llm-sim-{p}" for p in POLICIES]
    with deployed_app(
        serve_cluster, sim_pair_app(), "routing-sim", "/routing-sim", deployments
    ) as app_url:
        peaks, longs = {}, {}
        for policy in POLICIES:
            peaks[policy], longs[policy] = balance(app_url, f"sim-{policy}")
            assert len(peaks[policy]) == 2, f"{policy} used replicas {peaks[policy]}"
    imbalance = {p: max(v.values()) - min(v.values()) for p, v in peaks.items()}
    print(
        f"\nsimulated replicas: peak concurrent requests per replica {peaks}, long requests "
        f"per replica {longs}; imbalance {imbalance}"
    )
    assert imbalance["llm_aware"] < imbalance["round_robin"]


def test_llm_aware_routing_spreads_long_requests_over_real_engines(url):
    """The same load on two real engines: no replica gets most of the long requests. (Round-robin
    gives one replica all 16 of them, as the simulated pair above shows.)"""
    peak, longs = balance(url, NAME)
    print(
        f"\nreal engines: peak concurrent requests per replica {peak}, long requests per "
        f"replica {longs}"
    )
    assert len(peak) == 2 and len(longs) == 2, (peak, longs)
    # Of 16: round-robin puts all 16 on one replica, and a coin per request more than 10 one
    # time in four; the LLM-aware router sees the long ones running and splits them evenly.
    assert max(longs.values()) <= 10, longs


def test_a_request_for_an_adapter_goes_where_its_engine_holds_it(url):
    """Each engine holds one adapter at a time. The first request for adapter A loads it on one
    replica (the other still holds B, the last one both loaded at start); from then on, once the
    replicas have reported what they hold, A's requests go to A's replica and B's to B's: no
    adapter loaded twice, none evicted. With `adapter_weight` 0 both adapters ping-pong
    between the replicas."""
    a, b = ADAPTERS
    with httpx.Client(base_url=url, timeout=CALL_TIMEOUT_S) as c:

        def complete(model: str) -> httpx.Response:
            body = {"model": model, "prompt": "Hello", "max_tokens": 2}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r

        first = complete(a).headers["x-replica"]
        time.sleep(4 * 0.5 + 2.0)  # two stats periods and the watchdog's second look
        went: dict[str, set[str]] = {a: set(), b: set()}
        for i in range(8):
            model = ADAPTERS[i % 2]
            r = complete(model)
            went[model].add(r.headers["x-replica"])
            route = r.headers["x-route"]
            assert "reason=adapter" in route and "adapter_held=True" in route, (model, route)
    print(f"\nadapter A first loaded on {first}; replicas by adapter afterwards: {went}")
    assert went[a] == {first}, went
    assert len(went[b]) == 1 and went[b] != went[a], went


def _leave_after(url: str, body: dict, after_s: float, split: bool) -> None:
    """Send a non-streamed completion and leave after `after_s` with no answer: with httpx, or
    (`split`) over a socket that writes the headers and the body as two segments, as many
    clients do (httpx too, at times): what HAProxy's request splicing used to hide."""
    if not split:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", timeout=after_s, json=body)
        return
    target = httpx.URL(f"{url}/v1/completions")
    payload = json.dumps(body).encode()
    with socket.create_connection((target.host, target.port)) as sock:
        sock.sendall(
            f"POST {target.raw_path.decode()} HTTP/1.1\r\nHost: {target.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        )
        time.sleep(0.05)
        sock.sendall(payload)
        sock.settimeout(after_s)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing comes before the answer is complete


@pytest.mark.parametrize("split", [False, True], ids=["httpx", "headers-then-body"])
def test_non_streaming_disconnect_aborts_engine_request(url, split):
    """A client that stops waiting for a non-streamed answer ends its engine request: both
    replicas are idle well before the request would have finished by itself. Through HAProxy,
    as every client comes in: with Ray's `option splice-request` the client's leaving did not
    reach the Router (llmserve/edge/haproxy_loopback.sh removes it)."""
    handle = serve.get_deployment_handle(f"llm-{NAME}", app_name="routing")
    # Four choices: four sequences of work for the engine, a longer run to tell an abort by.
    body = {"model": NAME, "prompt": "Count", "ignore_eos": True, "n": 4}
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={**body, "max_tokens": 100})
    assert r.status_code == 200, r.text
    natural_s = (time.monotonic() - t0) * 10  # 1000 tokens at this host's pace
    client_timeout_s = 1.0
    _leave_after(url, {**body, "max_tokens": 1000}, client_timeout_s, split)
    left = time.monotonic()
    # Unaborted, the engine would still run for `natural_s - client_timeout_s`; aborted, it is
    # idle within half of that (ask several times: each call hits one of the replicas). An
    # abort takes a few tenths of a second; 1000 tokens took 4.1 s on the fastest host so far.
    bound_s = (natural_s - client_timeout_s) / 2
    assert bound_s >= 1, f"1000 tokens take {natural_s:.1f} s here: too fast to tell an abort"
    busy: dict[str, int] = defaultdict(int)
    while time.monotonic() - left < bound_s:
        for _ in range(6):
            s = handle.stats.remote().result(timeout_s=CALL_TIMEOUT_S)
            busy[s.extra["replica_id"]] = s.num_unfinished
        if len(busy) == 2 and not any(busy.values()):
            break
        time.sleep(0.2)
    idle_s = time.monotonic() - left
    print(
        f"\nafter the client left: idle in {idle_s:.1f} s (bound {bound_s:.1f} s; unaborted "
        f"{natural_s - client_timeout_s:.1f} s more); unfinished per replica {dict(busy)}"
    )
    assert len(busy) == 2 and not any(busy.values())


def test_a_conversation_continues_on_the_other_replica(url):
    """Responses API turns, each naming the one before by `previous_response_id`, until one
    lands on another replica than its previous turn: the stored turn is read there (from the
    app's ResponseStore; with vLLM's own store that turn is a 404), and the follow-up's prompt
    holds it."""
    with httpx.Client(base_url=url, timeout=CALL_TIMEOUT_S) as c:

        def turn(previous: dict | None) -> tuple[dict, str]:
            body = {"model": NAME, "input": "Go on.", "max_output_tokens": 4, "temperature": 0}
            if previous is not None:
                body["previous_response_id"] = previous["id"]
            r = c.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
            return r.json(), r.headers["x-replica"]

        previous, replica = turn(None)
        for _ in range(12):  # the router picks by load: a coin, between two idle replicas
            answer, on = turn(previous)
            assert answer["previous_response_id"] == previous["id"]
            held = previous["usage"]["input_tokens"] + previous["usage"]["output_tokens"]
            assert answer["usage"]["input_tokens"] > held, (answer["usage"], previous["usage"])
            if on != replica:
                break
            previous, replica = answer, on
        assert on != replica, "twelve follow-ups in a row on one replica"


def test_hung_engine_is_detected_and_replaced(url):
    """SIGSTOP one replica's engine: the one-token probe times out, the health check fails, and
    Serve replaces the replica; meanwhile and afterwards requests are served, and a Responses
    API conversation whose turn that replica answered goes on."""
    handle = serve.get_deployment_handle(f"llm-{NAME}", app_name="routing")
    stats = handle.stats.remote().result(timeout_s=CALL_TIMEOUT_S)
    victim, pid = stats.extra["replica_id"], stats.extra["engine_pid"]
    turn = {"model": NAME, "input": "Remember me.", "max_output_tokens": 4}
    for _ in range(12):  # one turn the victim answered
        r = httpx.post(f"{url}/v1/responses", json=turn, timeout=CALL_TIMEOUT_S)
        assert r.status_code == 200, r.text
        if r.headers["x-replica"] == victim:
            break
    assert r.headers["x-replica"] == victim, "twelve turns, none on the victim"
    victims_turn = r.json()["id"]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        replaced_s = None
        while time.monotonic() - t0 < ENGINE_READY_S:
            seen = {
                handle.stats.remote().result(timeout_s=CALL_TIMEOUT_S).extra["replica_id"]
                for _ in range(6)
            }
            d = serve.status().applications["routing"].deployments[f"llm-{NAME}"]
            if victim not in seen and d.replica_states == {"RUNNING": 2} and len(seen) == 2:
                replaced_s = time.monotonic() - t0
                break
            time.sleep(2)
        statuses = [
            httpx.post(
                f"{url}/v1/completions",
                timeout=CALL_TIMEOUT_S,
                json={"model": NAME, "prompt": f"after {i}", "max_tokens": 8},
            ).status_code
            for i in range(6)
        ]
        follow = httpx.post(
            f"{url}/v1/responses",
            json={**turn, "input": "Go on.", "previous_response_id": victims_turn},
            timeout=CALL_TIMEOUT_S,
        )
        print(f"\nhung engine's replica replaced after {replaced_s} s; then {statuses}")
        assert replaced_s is not None, "the hung replica was not replaced"
        assert statuses == [200] * 6
        # Its replica is gone; the conversation is not (the app's ResponseStore holds it).
        assert follow.status_code == 200, follow.text
        assert follow.json()["previous_response_id"] == victims_turn
    finally:
        try:  # the stopped engine process must not outlive the test
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- prefix-aware routing: a follow-up turn goes where its history is cached ------------------
# (last: the killed replica is not waited for)


@pytest.mark.parametrize(("path", "body"), BODIES)
def test_router_tokens_are_the_engines(url, model_dirs, path, body):
    """What the router hashes is what vLLM prefills: its own renderer answers /tokenize."""
    tokens = PromptTokens(model_dirs[TINY]).token_ids(path, body)
    r = httpx.post(f"{url}/tokenize", timeout=CALL_TIMEOUT_S, json={"model": NAME, **body})
    assert r.status_code == 200, r.text
    assert tokens == r.json()["tokens"]


def test_follow_up_turn_lands_where_its_prefix_is_cached(url):
    sessions = first_turns(url, NAME, range(NUM_SESSIONS))
    # Idle replicas tie and a coin breaks it: all six on one replica is a 1-in-32 draw (seen
    # in CI). More first turns until both hold one, so that landing right is not luck.
    more = iter(range(NUM_SESSIONS, 2 * NUM_SESSIONS))
    while len({replica for _, replica in sessions.values()}) < 2 and (s := next(more, None)):
        sessions |= first_turns(url, NAME, range(s, s + 1))
    replicas = {replica for _, replica in sessions.values()}
    time.sleep(REPORT_WAIT_S)
    results = []
    for s, (messages, first_replica) in sessions.items():
        body, route = chat(url, NAME, messages)
        cached = (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        results.append((s, first_replica, route, cached, body["usage"]["prompt_tokens"]))
    for r in results:
        print(
            f"\nsession {r[0]}: first turn on {r[1]}, follow-up {r[2]}, engine cached {r[3]}/{r[4]}"
        )
    # Both replicas served first turns (load spreads them), so landing right is not luck.
    assert len(replicas) == 2, sessions
    for s, first_replica, route, cached, _ in results:
        assert route["replica"] == first_replica, (s, route)
        assert route["reason"] == "prefix", (s, route)
        assert int(route["cached_tokens"]) >= 4 * 128, (s, route)
        assert int(route["runner_up_cached_tokens"]) == 0, (s, route)
        # The engine agrees: it prefilled only what was not cached.
        assert cached >= 4 * 128, (s, cached)


def test_killed_replica_leaves_the_index_within_seconds(url):
    sessions = first_turns(url, NAME, range(100, 104))
    victim = sessions[100][1]
    actor, pid = replica_actor("routing", f"llm-{NAME}", victim)
    ray.kill(actor, no_restart=True)
    t0 = time.monotonic()
    wait_gone(pid)  # ray.kill only asks
    dead_s = time.monotonic() - t0
    gone_s, routes = None, []
    while time.monotonic() - t0 < 30:
        for messages, _ in sessions.values():
            _, route = chat(url, NAME, messages)  # every request is answered (200) meanwhile
            routes.append((round(time.monotonic() - t0, 2), route))
            assert route["replica"] != victim
        # Gone from the router's candidates: neither chosen nor compared.
        if all(victim not in (r["chosen"], r["runner_up"]) for _, r in routes[-len(sessions) :]):
            gone_s = time.monotonic() - t0
            break
        time.sleep(0.2)
    print(
        f"\nkilled {victim}: dead after {dead_s:.2f} s, out of the router's view after {gone_s} s"
    )
    print(routes)
    assert gone_s is not None and gone_s < 10, routes
