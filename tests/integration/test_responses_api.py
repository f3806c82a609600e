"""OpenAI's Responses API through the platform, on the real engine, with the OpenAI SDK: a
plain and a streamed answer, a conversation continued by `previous_response_id`, a stored
response read back, and a tenant that cannot read or continue another's. The follow-up that
lands on another replica is in test_routing.py (two replicas); the answers equal `vllm serve`'s
in test_vllm_parity.py."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.apps import CALL_TIMEOUT_S, DEFAULT, KEYS, SIM_PREFIX
from tests.integration.helpers import SIM, SIM_KEY, auth

QUESTION = "What is the capital of France?"


def client(tenant: str | None) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=KEYS[tenant] if tenant else "none",
        max_retries=0,
        timeout=CALL_TIMEOUT_S,
        default_headers={} if tenant else {"Authorization": ""},
    )


@pytest.fixture
def sdk(base_url):
    def make(tenant: str | None = "interactive") -> openai.OpenAI:
        return client(tenant).with_options(base_url=f"{base_url}/v1")

    return make


def test_sdk_creates_plain_and_streamed_responses(sdk):
    ada = sdk()
    plain = ada.responses.create(model=DEFAULT, input=QUESTION, max_output_tokens=12, temperature=0)
    assert plain.object == "response" and plain.model == DEFAULT
    assert plain.output_text and plain.usage.output_tokens <= 12, plain
    kinds, deltas, completed = [], [], None
    with ada.responses.create(
        model=DEFAULT, input=QUESTION, max_output_tokens=12, temperature=0, stream=True
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.completed":
                completed = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert len(deltas) > 1  # streamed as the engine wrote it, not in one piece
    # Greedy: the stream says what the plain answer said.
    assert "".join(deltas) == completed.output_text == plain.output_text


def test_a_conversation_continues_by_id_and_reads_back(sdk):
    ada = sdk()
    first = ada.responses.create(
        model=DEFAULT, input="My name is Ada.", max_output_tokens=8, temperature=0
    )
    alone = ada.responses.create(
        model=DEFAULT, input="What is my name?", max_output_tokens=8, temperature=0
    )
    follow = ada.responses.create(
        model=DEFAULT,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert follow.previous_response_id == first.id
    # The first turn (its input and its answer) is in the follow-up's prompt.
    turn_tokens = first.usage.input_tokens + first.usage.output_tokens
    assert follow.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens
    assert follow.usage.input_tokens > turn_tokens, (follow.usage, first.usage)
    again = ada.responses.retrieve(first.id)
    assert again.model_dump() == first.model_dump()


def test_another_tenant_cannot_read_or_continue_a_response(sdk, http):
    first = sdk().responses.create(model=DEFAULT, input="A secret: 42.", max_output_tokens=4)
    for stranger in (sdk("batch"), sdk(None)):  # another key, and no key (anonymous)
        with pytest.raises(openai.NotFoundError) as e:
            stranger.responses.retrieve(first.id)
        assert e.value.body["message"] == f"Response with id '{first.id}' not found."
        with pytest.raises(openai.NotFoundError):
            stranger.responses.create(
                model=DEFAULT, input="What was it?", previous_response_id=first.id
            )
    unknown = http.get("/v1/responses/resp_0000", headers=auth("interactive"))
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["error"]["message"] == "Response with id 'resp_0000' not found."
    # A finished response cannot be cancelled (vLLM's answer); another tenant's is unknown.
    mine = http.post(f"/v1/responses/{first.id}/cancel", headers=auth("interactive"))
    theirs = http.post(f"/v1/responses/{first.id}/cancel", headers=auth("batch"))
    assert (mine.status_code, theirs.status_code) == (400, 404), (mine.text, theirs.text)
    wrong_key = http.get(f"/v1/responses/{first.id}", headers={"Authorization": "Bearer x"})
    assert wrong_key.status_code == 401, wrong_key.text


def test_admission_reads_max_output_tokens_and_refuses_background(http):
    body = {"model": DEFAULT, "input": QUESTION, "max_output_tokens": 200, "temperature": 0}
    capped = http.post("/v1/responses", json=body, headers=auth("capped"))
    assert capped.status_code == 200, capped.text
    assert capped.json()["max_output_tokens"] == 16  # the tenant's cap
    assert capped.headers["x-max-tokens-clamped"] == "200->16"
    background = http.post(
        "/v1/responses", json={**body, "background": True}, headers=auth("interactive")
    )
    assert background.status_code == 400, background.text
    assert background.json()["error"]["param"] == "background"


def test_bad_responses_input_is_an_openai_error(http):
    for body in ({"model": DEFAULT}, {"model": DEFAULT, "input": 5}, {"input": "hi"}):
        r = http.post("/v1/responses", json=body, headers=auth("interactive"))
        assert r.status_code == 400, (body, r.text)
        assert set(r.json()["error"]) >= {"message", "type", "code"}, r.text
    with httpx.Client(base_url=http.base_url, timeout=CALL_TIMEOUT_S) as c:
        r = c.post("/v1/responses", content=b"{not json", headers=auth("interactive"))
    assert r.status_code == 400, r.text


def test_an_engine_without_the_api_answers_404(base_url):
    """The simulated engine serves chat and completions only: a 404 that says so, whole (the
    replica's answer used to end without its end: a 503 "ended the reply early")."""
    r = httpx.post(
        f"{base_url}{SIM_PREFIX}/v1/responses",
        json={"model": SIM, "input": "hi"},
        headers=SIM_KEY,
        timeout=CALL_TIMEOUT_S,
    )
    assert r.status_code == 404, r.text
    assert r.json()["error"]["message"] == f"/v1/responses is not served for model {SIM}"
