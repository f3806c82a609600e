"""Conversations for the prefix-aware routing tests (test_routing.py): each has its own long
system prompt (four 128-token blocks and more), so only the replica that served its first turn
holds it; and bodies whose tokens the router must render as vLLM does."""

from __future__ import annotations

import httpx

from llmserve.protocol.replica_call import CHAT_PATH, COMPLETIONS_PATH
from tests.integration.apps import CALL_TIMEOUT_S

NUM_SESSIONS = 6
# Longer than the router's memory of what it routed (PrefixIndex.recent_s, 3 s): a follow-up
# after this finds its replica only through the replica's reported blocks.
REPORT_WAIT_S = 4.0
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()


def system_prompt(session: int) -> str:
    # ~600 tokens, different from the first token on: no two sessions share a block.
    words = " ".join(WORDS[(session + i) % len(WORDS)] for i in range(560))
    return f"Conversation {session}. You are assistant number {session}. {words}"


def chat(url: str, model: str, messages: list[dict]) -> tuple[dict, dict]:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=CALL_TIMEOUT_S,
        json={"model": model, "messages": messages, "max_tokens": 8, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    # x-route explains the router's choice; x-replica says who answered (another replica when
    # the chosen one failed before accepting it and Ray fell back to the next one ranked).
    route = dict(kv.split("=", 1) for kv in r.headers["x-route"].split("; "))
    return r.json(), {**route, "chosen": route["replica"], "replica": r.headers["x-replica"]}


def first_turns(url: str, model: str, sessions: range) -> dict[int, tuple[list[dict], str]]:
    out = {}
    for s in sessions:
        messages = [
            {"role": "system", "content": system_prompt(s)},
            {"role": "user", "content": f"Hello from session {s}."},
        ]
        body, route = chat(url, model, messages)
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": "And then?"})
        out[s] = (messages, route["replica"])
    return out


BODIES = [
    (CHAT_PATH, {"messages": [{"role": "user", "content": "Hello there"}]}),
    (
        CHAT_PATH,
        {
            "messages": [
                {"role": "system", "content": "Be brief.\n\nAlways."},
                {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "4"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "And"},
                        {"type": "text", "text": "3 + 3?"},
                    ],
                },
            ]
        },
    ),
    (CHAT_PATH, {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False}),
    (COMPLETIONS_PATH, {"prompt": "Once upon a time, in a land far away"}),
]
