"""The requests of the parity test (test_vllm_parity.py): every field family of chat,
completions and the Responses API, tokenize, a LoRA adapter, and invalid variants, each sent to
the platform and to a bare `vllm serve`."""

from __future__ import annotations

from tests.integration.apps import DEFAULT

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
ADAPTER = "smollm2-parity-lora"  # a random adapter (random:7): its answers differ from the base's
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
    "chat adapter greedy": chat(model=ADAPTER),
    "chat adapter stream": chat(model=ADAPTER, stream=True, max_tokens=8),
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
    "completion adapter logprobs": completion(model=ADAPTER, logprobs=2),
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
