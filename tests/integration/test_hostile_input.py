"""Hostile bodies against the live app: the usual abuses, each aimed at one limit.

A prompt past the context window, bodies past the size limit (declared or sent in chunks), bodies
that are not JSON objects (empty, invalid UTF-8, form data, 100000 levels of nesting, NaN),
huge n, best_of and logprobs, stop strings that never match, and a wrong JSON type for every
field of the served schema. Each gets its documented answer: a refusal (an OpenAI-shaped 400 or
413, naming the field where there is one) about as fast as an empty body's, or a 200 for the
largest values accepted; never a 500 and never a hang; afterwards the engines hold no request
and /healthz says so. Sent on purpose, because fuzzing from the schema (test_api_fuzzing.py)
seldom draws bodies of these sizes and shapes.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
import pytest

from tests.integration.conftest import CHAT, COMPLETIONS, MAX_BODY_BYTES, SIM_PREFIX, TINY
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
    for body in ({"model": TINY, "prompt": list(range(100, 1200)), "max_tokens": 4},  # 1100 ids
                 {"model": TINY, "prompt": "word " * 1500},
                 {"model": TINY, "messages": [{"role": "user", "content": "word " * 1500}]},
                 {"model": TINY, "prompt": "Hi", "max_tokens": 1024}):  # fmt: skip
        t0 = time.monotonic()
        path = CHAT if "messages" in body else COMPLETIONS
        err = assert_openai_error(http.post(path, json=body), 400)
        assert "maximum context length is 1024" in err["message"]
        assert err["param"] in ("prompt", "messages", "max_tokens")
        took.append(time.monotonic() - t0)
    print(f"\nrefused in {[round(t, 2) for t in took]} s; bound {fast_s:.2f} s")
    assert max(took) < fast_s, took
    r = httpx.post(f"{base_url}{SIM_PREFIX}{COMPLETIONS}", headers=SIM_KEY, timeout=60,
                   json={"model": SIM, "prompt": "word " * 3000})  # fmt: skip
    assert_openai_error(r, 400)


def router_rss_bytes() -> int:
    """Resident memory of the main app's Router replica process (from the GCS actor table: the
    test cluster runs without the dashboard that ray.util.state needs)."""
    import psutil
    import ray

    pids = [a["Pid"] for a in ray._private.state.actors().values()
            if a["ActorClassName"] == "ServeReplica:llmserve:Router" and a["State"] == "ALIVE"]
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
    body = json.dumps({"model": TINY, "messages": [{"role": "user", "content": ""}] * most},
                      separators=(",", ":"))  # fmt: skip
    assert len(body) < MAX_BODY_BYTES
    t0 = time.monotonic()
    r = http.post(CHAT, content=body.encode())
    fitting_s = time.monotonic() - t0
    assert_openai_error(r, 400, "messages")
    rss_after = router_rss_bytes()
    print(f"\n1M messages ({len(million) / 1e6:.0f} MB): 413 in {declared_s:.2f} s; "
          f"~25 MB chunked: 413 in {chunked_s:.2f} s; {most} messages under the limit: 400 in {fitting_s:.2f} s; "
          f"Router RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB; "
          f"an empty body's 400 in {baseline_s:.3f} s")  # fmt: skip
    assert declared_s < max(5, 20 * baseline_s) and fitting_s < max(15, 60 * baseline_s)
    assert rss_after - rss_before < 200 * 2**20, "the Router kept what it was sent"
    wait_idle(http)


def test_bodies_that_are_not_json_objects_are_400s(http):
    tiny = {"model": TINY, "prompt": "Hi", "max_tokens": 2}
    cases = {
        "empty": (b"", {}),
        "invalid UTF-8": (b'{"model": "tiny", "prompt": "\xff\xfe\xc3"}', {}),
        "form-encoded": (b"model=tiny&prompt=hi",
                         {"content-type": "application/x-www-form-urlencoded"}),
        "multipart": (b"--b\r\nContent-Disposition: form-data; name=model\r\n\r\nx\r\n--b--\r\n",
                      {"content-type": "multipart/form-data; boundary=b"}),
        "100000 levels of [": (b"[" * 100_000, {}),
        "100000 levels inside a field": (
            b'{"model": "%s", "prompt": ' % TINY.encode() + b"[" * 100_000 + b"]" * 100_000 + b"}",
            {}),
        "an integer of 5000 digits": (
            b'{"model": "x", "prompt": "Hi", "seed": ' + b"9" * 5000 + b"}", {}),
        "NaN": (b'{"model": "%s", "prompt": "Hi", "temperature": NaN}' % TINY.encode(), {}),
        "a JSON array": (b"[1, 2]", {}),
        "a JSON string": (b'"hello"', {}),
        "truncated": (json.dumps(tiny).encode()[:-5], {}),
    }  # fmt: skip
    fast_s = max(5, 20 * refusal_baseline_s(http))
    for name, (content, headers) in cases.items():
        for path in (CHAT, COMPLETIONS):
            t0 = time.monotonic()
            r = http.post(path, content=content, headers=headers)
            assert_openai_error(r, 400)
            assert time.monotonic() - t0 < fast_s, (name, fast_s)
    # JSON sent as text/plain is still JSON: served, as OpenAI's own server does.
    r = http.post(COMPLETIONS, content=json.dumps(tiny), headers={"content-type": "text/plain"})
    assert r.status_code == 200, r.text
    assert http.get("/healthz").status_code == 200
    wait_idle(http)


def test_huge_n_best_of_and_logprobs_are_refused(http):
    def chat(**kw):
        return {"model": TINY, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                **kw}

    def completion(**kw):
        return {"model": TINY, "prompt": "Hi", "max_tokens": 2, **kw}

    refused = [
        (CHAT, chat(n=10**6), "n"), (CHAT, chat(n=2**70), "n"), (CHAT, chat(n=0), "n"),
        (COMPLETIONS, completion(best_of=10**6), "best_of"),
        (COMPLETIONS, completion(n=2, best_of=10**9), "best_of"),
        (COMPLETIONS, completion(n=2**64, best_of=2**64), "n"),
        (CHAT, chat(logprobs=True), "logprobs"),
        (CHAT, chat(logprobs=True, top_logprobs=20), "logprobs"),
        (CHAT, chat(top_logprobs=10**9), "top_logprobs"),
        (CHAT, chat(top_logprobs=-1), "top_logprobs"),
        (COMPLETIONS, completion(logprobs=5), "logprobs"),
        (COMPLETIONS, completion(logprobs=10**9), "logprobs"),
        (COMPLETIONS, completion(seed=2**70), "seed"),
        (COMPLETIONS, completion(top_k=10**23), "top_k"),
        (COMPLETIONS, completion(prompt=[2**64]), "prompt"),
        (COMPLETIONS, completion(stop_token_ids=[2**64]), "stop_token_ids.0"),
    ]  # fmt: skip
    fast_s = max(5, 20 * refusal_baseline_s(http))
    for path, body, param in refused:
        t0 = time.monotonic()
        assert_openai_error(http.post(path, json=body), 400, param)
        assert time.monotonic() - t0 < fast_s, (body, fast_s)
    # The largest accepted values are served.
    r = http.post(COMPLETIONS, json=completion(n=8, best_of=8, logprobs=0, seed=2**63 - 1,
                                               top_k=2**63 - 1))  # fmt: skip
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 8
    r = http.post(CHAT, json=chat(logprobs=False, top_logprobs=None))
    assert r.status_code == 200, r.text
    wait_idle(http)


def test_stop_strings_that_never_match_end_at_max_tokens(http):
    stops = [f"{i:02d}" + "\u2603" * 254 for i in range(16)]  # 16 strings of 256 characters
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
    print(f"\n40 tokens: {t_plain:.2f} s without stop strings, {t_stop:.2f} s with 16")
    assert t_stop < 3 * t_plain + 5
    for stop, param in ((stops + ["x"], "stop"), (["x" * 257], "stop"), ([""], "stop"),
                        ([5], "stop.0")):  # fmt: skip
        err = assert_openai_error(http.post(COMPLETIONS, json={"model": TINY, "prompt": "Hi",
                                                               "stop": stop}), 400)  # fmt: skip
        assert err["param"].startswith("stop"), (param, err)
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
        kind = {dict: "object", list: "array", str: "string", int: "integer", float: "number",
                bool: "boolean"}[type(v)]  # fmt: skip
        if kind in allowed or (kind == "integer" and "number" in allowed):
            continue
        if "enum" in prop or "const" in prop:
            continue
        wrong.append(v)
    return wrong


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_wrong_types_for_every_field_are_400s_naming_the_field(openapi, http, path):
    schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    valid = ({"model": TINY, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
             if path == CHAT else {"model": TINY, "prompt": "Hi", "max_tokens": 2})  # fmt: skip
    assert http.post(path, json=valid).status_code == 200
    tried = []
    for field, prop in schema["properties"].items():
        for value in _wrong_values(prop):
            r = http.post(path, json={**valid, field: value})
            err = assert_openai_error(r, 400)
            assert (err["param"] or "").split(".")[0] == field, (field, value, err)
            tried.append(field)
    print(f"\n{path}: {len(tried)} wrong-typed bodies over {len(set(tried))} fields, all 400")
    assert len(set(tried)) == len(schema["properties"])
    wait_idle(http)
