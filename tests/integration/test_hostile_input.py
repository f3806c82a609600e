"""Hostile bodies against the live app: the usual abuses, each aimed at one limit.

A prompt past the context window, bodies past the size limit (declared or sent in chunks), bodies
that are not JSON objects (empty, invalid UTF-8, form data, 100000 levels of nesting, NaN),
integers past 64 bits, huge n and logprobs, stop strings that never match, and a wrong JSON type
for every field of the served schema (vLLM's). The platform's own limits (body size, JSON, n,
64-bit integers, timeout) are refused by the Router; every other field is vLLM's, answered by
vLLM's own server as `vllm serve` answers it (the parity test compares the two). Either way:
an OpenAI-shaped 4xx about as fast as an empty body's, or a 200; never a 500 and never a hang;
afterwards the engines hold no request and /healthz says so. Sent on purpose, because fuzzing
from the schema (test_api_fuzzing.py) seldom draws bodies of these sizes and shapes.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
import pytest

from tests.integration.apps import CHAT, COMPLETIONS, MAX_BODY_BYTES, SIM_PREFIX, TINY
from tests.integration.helpers import SIM, SIM_KEY, wait_idle


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"], err
    if param is not None:
        assert err["param"] == param, err
    assert r.headers.get("x-request-id")
    return err


def refusal_baseline_s(http: httpx.Client) -> float:
    """Median time of an empty body's 400 on this host now: what "at once" can mean here."""
    times = []
    for _ in range(5):
        t0 = time.monotonic()
        assert_openai_error(http.post(COMPLETIONS, content=b""), 400)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def test_prompt_past_the_context_window_is_a_400(http, base_url):
    fast_s = max(5, 20 * refusal_baseline_s(http))
    took = []
    for body in (
        {"model": TINY, "prompt": list(range(100, 1200)), "max_tokens": 4},  # 1100 ids
        {"model": TINY, "prompt": "word " * 1500},
        {"model": TINY, "messages": [{"role": "user", "content": "word " * 1500}]},
        {"model": TINY, "prompt": "Hi", "max_tokens": 5000},
    ):
        t0 = time.monotonic()
        path = CHAT if "messages" in body else COMPLETIONS
        err = assert_openai_error(http.post(path, json=body), 400)
        assert "1024" in err["message"], err  # vLLM's own words name the context window
        took.append(time.monotonic() - t0)
    print(f"\nrefused in {[round(t, 2) for t in took]} s; bound {fast_s:.2f} s")
    assert max(took) < fast_s, took
    r = httpx.post(
        f"{base_url}{SIM_PREFIX}{COMPLETIONS}",
        headers=SIM_KEY,
        timeout=60,
        json={"model": SIM, "prompt": "word " * 3000},
    )
    assert_openai_error(r, 400)


def router_rss_bytes() -> int:
    """Resident memory of the main app's Router replica process (from the GCS actor table: the
    test cluster runs without the dashboard that ray.util.state needs)."""
    import psutil
    import ray

    pids = [
        a["Pid"]
        for a in ray._private.state.actors().values()
        if a["ActorClassName"] == "ServeReplica:llmserve:Router" and a["State"] == "ALIVE"
    ]
    assert len(pids) == 1, pids
    return psutil.Process(pids[0]).memory_info().rss


def test_oversized_bodies_are_413_at_once_and_leave_no_memory(http):
    baseline_s = refusal_baseline_s(http)
    rss_before = router_rss_bytes()
    million = json.dumps({"model": TINY, "messages": [{"role": "user", "content": "x"}] * 10**6})
    t0 = time.monotonic()
    assert_openai_error(http.post(CHAT, content=million.encode()), 413)  # declared length
    declared_s = time.monotonic() - t0

    def chunks():  # no content-length: the Router counts while it reads, and stops at the limit
        yield b'{"model": "%s", "messages": [' % TINY.encode()
        piece = b'{"role": "user", "content": "x"},' * 2000
        for _ in range(400):  # ~25 MB
            yield piece
        yield b'{"role": "user", "content": "x"}]}'

    t0 = time.monotonic()
    err = assert_openai_error(http.post(CHAT, content=chunks()), 413)
    chunked_s = time.monotonic() - t0
    assert err["code"] == "request_too_large"
    # The most messages that fit under the limit: parsed, rendered and refused for the context.
    most = (MAX_BODY_BYTES - 100) // len('{"role":"user","content":""},')
    body = json.dumps(
        {"model": TINY, "messages": [{"role": "user", "content": ""}] * most}, separators=(",", ":")
    )
    assert len(body) < MAX_BODY_BYTES
    t0 = time.monotonic()
    r = http.post(CHAT, content=body.encode())
    fitting_s = time.monotonic() - t0
    assert "maximum context length" in assert_openai_error(r, 400)["message"]
    rss_after = router_rss_bytes()
    print(
        f"\n1M messages ({len(million) / 1e6:.0f} MB): 413 in {declared_s:.2f} s; "
        f"~25 MB chunked: 413 in {chunked_s:.2f} s; {most} messages under the limit: "
        f"400 in {fitting_s:.2f} s; "
        f"Router RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB; "
        f"an empty body's 400 in {baseline_s:.3f} s"
    )
    assert declared_s < max(5, 20 * baseline_s) and fitting_s < max(15, 60 * baseline_s)
    assert rss_after - rss_before < 200 * 2**20, "the Router kept what it was sent"
    wait_idle(http)


def test_bodies_that_are_not_json_objects_are_400s(http):
    tiny = {"model": TINY, "prompt": "Hi", "max_tokens": 2}
    cases = {
        "empty": (b"", {}),
        "invalid UTF-8": (b'{"model": "tiny", "prompt": "\xff\xfe\xc3"}', {}),
        "form-encoded": (
            b"model=tiny&prompt=hi",
            {"content-type": "application/x-www-form-urlencoded"},
        ),
        "multipart": (
            b"--b\r\nContent-Disposition: form-data; name=model\r\n\r\nx\r\n--b--\r\n",
            {"content-type": "multipart/form-data; boundary=b"},
        ),
        "100000 levels of [": (b"[" * 100_000, {}),
        "100000 levels inside a field": (
            b'{"model": "%s", "prompt": ' % TINY.encode() + b"[" * 100_000 + b"]" * 100_000 + b"}",
            {},
        ),
        "an integer of 5000 digits": (
            b'{"model": "x", "prompt": "Hi", "seed": ' + b"9" * 5000 + b"}",
            {},
        ),
        "NaN": (b'{"model": "%s", "prompt": "Hi", "temperature": NaN}' % TINY.encode(), {}),
        "a JSON array": (b"[1, 2]", {}),
        "a JSON string": (b'"hello"', {}),
        "truncated": (json.dumps(tiny).encode()[:-5], {}),
    }
    fast_s = max(5, 20 * refusal_baseline_s(http))
    for name, (content, headers) in cases.items():
        for path in (CHAT, COMPLETIONS):
            t0 = time.monotonic()
            r = http.post(path, content=content, headers=headers)
            assert_openai_error(r, 400)
            assert time.monotonic() - t0 < fast_s, (name, fast_s)
    # JSON sent as text/plain: vLLM's own server refuses the media type, and so do we.
    r = http.post(COMPLETIONS, content=json.dumps(tiny), headers={"content-type": "text/plain"})
    assert "Unsupported Media Type" in assert_openai_error(r, 400)["message"]
    assert http.get("/healthz").status_code == 200
    wait_idle(http)


def test_huge_n_logprobs_and_wide_integers_are_refused(http):
    def chat(**kw):
        return {
            "model": TINY,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            **kw,
        }

    def completion(**kw):
        return {"model": TINY, "prompt": "Hi", "max_tokens": 2, **kw}

    refused = [  # (path, body, the param the refusal names, or None where vLLM names none)
        # The Router's: n above http.max_n, integers past 64 bits (vLLM's server 500s on some).
        (CHAT, chat(n=10**6), "n"),
        (CHAT, chat(n=2**70), None),
        (COMPLETIONS, completion(seed=2**70), None),
        (COMPLETIONS, completion(top_k=10**23), None),
        (COMPLETIONS, completion(prompt=[2**64]), None),
        (COMPLETIONS, completion(stop_token_ids=[2**64]), None),
        # vLLM's.
        (CHAT, chat(n=0), None),
        (CHAT, chat(top_logprobs=10**9), "top_logprobs"),
        (CHAT, chat(top_logprobs=-1), "top_logprobs"),
        (COMPLETIONS, completion(logprobs=10**9), "logprobs"),
        (COMPLETIONS, completion(prompt=[10**8]), None),  # out of the vocabulary
        (COMPLETIONS, completion(logit_bias={"99999999": 1}), "logit_bias"),
    ]
    fast_s = max(5, 20 * refusal_baseline_s(http))
    for path, body, param in refused:
        t0 = time.monotonic()
        assert_openai_error(http.post(path, json=body), 400, param)
        assert time.monotonic() - t0 < fast_s, (body, fast_s)
    # The largest values accepted are served: 64-bit extremes, logprobs, n up to max_n.
    r = http.post(COMPLETIONS, json=completion(n=8, logprobs=5, seed=2**63 - 1, top_k=2**63 - 1))
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 8 and r.json()["choices"][0]["logprobs"]["tokens"]
    r = http.post(CHAT, json=chat(logprobs=True, top_logprobs=20))
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    wait_idle(http)


def test_stop_strings_that_never_match_end_at_max_tokens(http):
    stops = [f"{i:02d}" + "\u2603" * 254 for i in range(4)]  # vLLM's most: 4, of 256 chars
    plain = {"model": TINY, "prompt": "Hi", "max_tokens": 40, "ignore_eos": True}
    # The same request without stop strings, side by side: the host's speed now, not a constant.
    t0 = time.monotonic()
    assert http.post(COMPLETIONS, json=plain).status_code == 200
    t_plain = time.monotonic() - t0
    t0 = time.monotonic()
    r = http.post(COMPLETIONS, json={**plain, "stop": stops})
    t_stop = time.monotonic() - t0
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 40
    print(f"\n40 tokens: {t_plain:.2f} s without stop strings, {t_stop:.2f} s with 4")
    assert t_stop < 3 * t_plain + 5
    err = assert_openai_error(
        http.post(COMPLETIONS, json={"model": TINY, "prompt": "Hi", "stop": [5]}), 400
    )
    assert "stop" in err["message"]
    wait_idle(http)


WRONG_TYPES = [{"an": "object"}, [1, 2], "a string", 12, 1.5, True]


def _wrong_values(prop: dict) -> list:
    """Values of other JSON types than the field's schema allows."""
    allowed = set()
    for alt in prop.get("anyOf", [prop]):
        t = alt.get("type")
        allowed.update(t if isinstance(t, list) else [t])
    wrong = []
    for v in WRONG_TYPES:
        kind = {
            dict: "object",
            list: "array",
            str: "string",
            int: "integer",
            float: "number",
            bool: "boolean",
        }[type(v)]
        if kind in allowed or (kind == "integer" and "number" in allowed):
            continue
        if "enum" in prop or "const" in prop:
            continue
        wrong.append(v)
    return wrong


def request_schema(openapi: dict, path: str) -> dict:
    """The served request schema of a route (vLLM's, with $refs resolved one level)."""
    schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    ref = schema.get("$ref") or next(
        (a["$ref"] for a in schema.get("anyOf", []) if "$ref" in a), None
    )
    return openapi["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_wrong_types_for_every_field_never_fail_the_server(openapi, http, path):
    """A value of another JSON type for each of vLLM's fields: vLLM's own answer (a 400, or a
    200 where vLLM reads the value leniently, as `"stream": "true"`), never a 500 or a hang."""
    schema = request_schema(openapi, path)
    valid = (
        {"model": TINY, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        if path == CHAT
        else {"model": TINY, "prompt": "Hi", "max_tokens": 2}
    )
    assert http.post(path, json=valid).status_code == 200
    statuses = []
    for field, prop in schema["properties"].items():
        if field in ("stream", "n"):  # a lenient "true" streams; n is the Router's (above)
            continue
        for value in _wrong_values(prop)[:2]:
            r = http.post(path, json={**valid, field: value})
            assert r.status_code < 500, (field, value, r.text[:300])
            if r.status_code != 200:
                assert_openai_error(r, r.status_code)
            statuses.append(r.status_code)
    print(
        f"\n{path}: {len(statuses)} wrong-typed bodies over {len(schema['properties'])} "
        f"fields: {statuses.count(400)} refused, {statuses.count(200)} served"
    )
    assert statuses.count(400) > 20
    wait_idle(http)
