"""The OpenAI API through the real stack: HTTP -> Ray Serve proxy -> Router -> LLMServer -> vLLM."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest

from tests.integration.apps import (
    DEFAULT,
    INT8,
    KEYS,
    MAX_BODY_BYTES,
    TINY,
    TINY_LORA,
    TINY_LORA_PRIVATE,
)
from tests.integration.conftest import engine_stats
from tests.integration.helpers import auth

PARIS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
TRACEPARENT_RE = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


@pytest.fixture
def client(base_url):
    # The SDK always sends a key: a tenant's (a wrong one would be a 401).
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEYS["interactive"], max_retries=0)


def test_chat_answer_mentions_paris(client):
    raw = client.chat.completions.with_raw_response.create(
        model=DEFAULT, messages=PARIS, temperature=0, max_tokens=30
    )
    assert raw.headers["x-request-id"]
    assert TRACEPARENT_RE.match(raw.headers["traceparent"])
    resp = raw.parse()
    assert "Paris" in resp.choices[0].message.content
    assert resp.model == DEFAULT
    assert resp.choices[0].finish_reason in ("stop", "length")
    u = resp.usage
    assert u.prompt_tokens > 0 and u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_stream_sends_tokens_as_they_are_generated(client):
    t0 = time.monotonic()
    arrivals, text, usage = [], "", None
    stream = client.chat.completions.create(
        model=DEFAULT,
        messages=PARIS,
        temperature=0,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                arrivals.append(time.monotonic() - t0)
                text += choice.delta.content
    first, last = arrivals[0], arrivals[-1]
    print(f"\n{len(arrivals)} content chunks, first at {first:.3f} s, last at {last:.3f} s")
    assert text.startswith("The capital of France is Paris.")
    assert len(arrivals) >= 32, "tokens were buffered into few chunks"
    assert first < 0.5 * last, "the first token did not arrive well before the last"
    assert usage is not None and usage.completion_tokens == 64


def test_completions_stream_and_echo(client):
    chunks = list(
        client.completions.create(
            model=DEFAULT, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True
        )
    )
    assert len(chunks) >= 2
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    whole = client.completions.create(
        model=DEFAULT, prompt="Once upon a time", max_tokens=8, temperature=0, echo=True
    )
    assert whole.choices[0].text == "Once upon a time" + streamed


def test_two_models_each_answer_their_own_requests(client):
    before = {m: engine_stats(m).extra["num_requests_total"] for m in (DEFAULT, TINY)}
    smol = client.chat.completions.create(
        model=DEFAULT, messages=PARIS, temperature=0, max_tokens=20
    )
    tiny = [
        client.chat.completions.create(model=TINY, messages=PARIS, temperature=0, max_tokens=20)
        for _ in range(2)
    ]
    after = {m: engine_stats(m).extra["num_requests_total"] for m in (DEFAULT, TINY)}
    assert (after[DEFAULT] - before[DEFAULT], after[TINY] - before[TINY]) == (1, 2)
    assert smol.model == DEFAULT and all(t.model == TINY for t in tiny)
    assert "Paris" in smol.choices[0].message.content
    # Random weights: deterministic under greedy decoding, and not the trained model's answer.
    assert tiny[0].choices[0].message.content == tiny[1].choices[0].message.content
    assert "Paris" not in tiny[0].choices[0].message.content
    models = {m.id for m in client.models.list()}
    assert models == {DEFAULT, TINY, INT8, TINY_LORA, TINY_LORA_PRIVATE}


def test_an_adapter_answers_on_its_base_models_engine_and_only_to_its_tenants(client, http):
    """The tiny model's random LoRA adapter (conftest), loaded when its engine started."""
    before = engine_stats(TINY).extra["num_requests_total"]
    ask = {"messages": PARIS, "temperature": 0, "max_tokens": 20}
    base = client.chat.completions.create(model=TINY, **ask).choices[0].message.content
    adapted = client.chat.completions.create(model=TINY_LORA, **ask)
    assert adapted.model == TINY_LORA
    stream = client.chat.completions.create(model=TINY_LORA, stream=True, **ask)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert engine_stats(TINY).extra["num_requests_total"] - before == 3  # all on the base's
    # Greedy: the adapter's answer is its own, every time, and not the base model's.
    assert adapted.choices[0].message.content == streamed != base, (base, streamed)
    cards = {m["id"]: m for m in http.get("/v1/models", headers=auth("interactive")).json()["data"]}
    assert cards[TINY_LORA]["parent"] == TINY and "parent" not in cards[TINY]
    # The private adapter names its tenant; to any other, it is as unknown as a wrong name.
    body = {"model": TINY_LORA_PRIVATE, **ask}
    assert http.post(CHAT, json=body, headers=auth("interactive")).status_code == 200
    for tenant in ("batch", "tiny-only"):  # every model / the base model alone
        r = http.post(CHAT, json=body, headers=auth(tenant))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        assert TINY_LORA_PRIVATE not in {
            m["id"] for m in http.get("/v1/models", headers=auth(tenant)).json()["data"]
        }
    r = http.post(CHAT, json={**body, "model": "tiny-llama-random-lora-x"}, headers=auth("batch"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def _assert_openai_error(r: httpx.Response, status: int, param: str | None = None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    assert r.headers.get("x-request-id")
    return err


CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    "body,status,param",
    [
        # The platform's own fields.
        ({"model": "no-such-model", "messages": PARIS}, 404, "model"),
        ({"model": 42, "messages": PARIS}, 400, "model"),
        ({"messages": PARIS}, 400, "model"),
        ({"model": DEFAULT, "messages": PARIS, "n": 1000}, 400, "n"),
        ({"model": DEFAULT, "messages": PARIS, "timeout": -1}, 400, "timeout"),
        # vLLM's, answered by vLLM's own server in its own words (the parity test compares
        # them with bare vLLM's).
        ({"model": DEFAULT, "messages": PARIS, "max_tokens": -5}, 400, "max_tokens"),
        ({"model": DEFAULT}, 400, "body.messages"),
        ({"model": DEFAULT, "messages": "hello"}, 400, "body.messages"),
        ({"model": DEFAULT, "messages": PARIS, "temperature": "hot"}, 400, "body.temperature"),
        ({"model": DEFAULT, "messages": PARIS, "max_tokens": 5000}, 400, "max_tokens"),
    ],
)
def test_bad_requests_get_openai_errors(http, body, status, param):
    err = _assert_openai_error(http.post(CHAT, json=body), status, param)
    if status == 404:  # one answer for "no such model" and "not yours": no model is named
        assert "does not exist" in err["message"] and DEFAULT not in err["message"]


def test_bad_bodies(http):
    _assert_openai_error(
        http.post(CHAT, content=b"{not json", headers={"content-type": "application/json"}), 400
    )
    _assert_openai_error(http.post(CHAT, content=b"\xff\xfe{}"), 400)
    _assert_openai_error(http.post(CHAT, content=b"[1, 2]"), 400)
    big = {"model": DEFAULT, "messages": [{"role": "user", "content": "x" * MAX_BODY_BYTES}]}
    _assert_openai_error(http.post(CHAT, json=big), 413)
    _assert_openai_error(http.get("/v1/nothing-here"), 404)


def test_prompt_longer_than_context_is_rejected(http):
    long_prompt = "word " * 3000  # > 2048 tokens, under the body limit
    r = http.post("/v1/completions", json={"model": DEFAULT, "prompt": long_prompt})
    err = _assert_openai_error(r, 400, "input_tokens")
    assert "maximum context length is 2048" in err["message"]
    r = http.post(
        CHAT, json={"model": DEFAULT, "messages": [{"role": "user", "content": long_prompt}]}
    )
    err = _assert_openai_error(r, 400)
    assert "maximum context length is 2048" in err["message"]


def test_server_keeps_serving_after_bad_input(http, client):
    for body in (b"{", b"[]", b'{"model": "x"}'):
        http.post(CHAT, content=body)
    assert engine_stats(DEFAULT).num_unfinished == 0
    resp = client.chat.completions.create(
        model=DEFAULT, messages=PARIS, temperature=0, max_tokens=20
    )
    assert "Paris" in resp.choices[0].message.content
    assert http.get("/healthz").status_code == 200


def test_readyz_says_ready_once_every_model_has_a_running_replica(http):
    # The Router learns each count from Ray's long poll, or from the controller every 2 s for a
    # model with no request yet; the app is up, so it must turn ready.
    deadline = time.monotonic() + 120
    key = {"Authorization": f"Bearer {KEYS['interactive']}"}
    while (r := http.get("/readyz", headers=key)).status_code != 200:
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert time.monotonic() < deadline, r.text
        time.sleep(0.5)
    assert DEFAULT in r.json()["models"]  # with a key: the models it may use
    # Without a key: ready or not, and how many models, never which.
    anonymous = http.get("/readyz").json()
    assert anonymous == {"status": "ready", "num_models": 3}, anonymous


def test_client_request_id_and_trace_are_continued(http):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = http.post(
        CHAT,
        json={"model": DEFAULT, "messages": PARIS, "max_tokens": 2},
        headers={"x-request-id": "my-req-123", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "my-req-123"
    assert r.headers["traceparent"].split("-")[1] == trace_id
