"""Resuming a stream on another replica, pure: which requests can be, and the request that does.

A stream resumes as a continuation: its prompt's token ids and those of the answer its client
already has become the prompt of a `/v1/completions` request with the same sampling parameters,
`max_tokens` less what was sent. The engine then goes on from exactly there: a greedy answer is
the one an unbroken stream gives; a sampled one goes on with the same distribution (not the same
draws: its seed starts again).

Resumable: a stream of chat or completions, one choice, plain text. Not resumable, because the
continuation could not say the same thing: several choices, logprobs (their offsets and format),
tools, structured output and grammars (their state is not in the tokens), `stop` strings (the
engine holds back text that might start one, and a stop spanning the break would be missed),
`echo`, continuous usage, and any field this module does not know (it might change the answer).
llmserve/router/reply_relay.py acts on it; llmserve/replica/resumable.py reframes the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmserve.protocol.replica_call import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    RawIds,
    Resume,
    StreamStart,
    parse_ids,
)

# Sampling and output fields a continuation keeps as they were.
CARRIED = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "presence_penalty",  # counted over the answer after the break only (docs/operations.md)
        "frequency_penalty",
        "repetition_penalty",
        "length_penalty",
        "ignore_eos",
        "stop_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "priority",
        "cache_salt",
        "user",
        "stream",
        "stream_options",
        "model",
    }
)
# Fields that shape the prompt only: the prompt's token ids already hold what they did.
PROMPT_ONLY = frozenset(
    {
        "messages",
        "prompt",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "documents",
        "truncate_prompt_tokens",
        "echo",  # false only (below)
        "n",  # 1 only
        "logprobs",  # off only
        "top_logprobs",
        "parallel_tool_calls",
        "tool_choice",  # "none" or absent only
        "return_token_ids",  # the Router's own
        "request_id",
    }
)
PLATFORM = frozenset({"timeout"})  # the Router's, never forwarded
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")
COUNTED = ("min_tokens",)


def resumable(path: str, body: Mapping[str, Any]) -> bool:
    """Whether a stream of this body may resume on another replica (the body as forwarded)."""
    if path not in (CHAT_PATH, COMPLETIONS_PATH) or body.get("stream") is not True:
        return False
    known = CARRIED | PROMPT_ONLY | PLATFORM | set(MAX_TOKENS_FIELDS) | set(COUNTED)
    if any(k not in known for k in body):
        return False
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        return False
    return (
        body.get("n") in (None, 1)
        and body.get("echo") in (None, False)
        and body.get("logprobs") in (None, False)
        and body.get("top_logprobs") in (None, 0)
        and body.get("tool_choice") in (None, "none")
        and body.get("return_token_ids") in (None, False)  # the client's own: not stripped
        and isinstance(body.get("prompt", ""), str)  # one prompt (a list is a batch of them)
    )


def continuation_body(body: Mapping[str, Any], resume: Resume) -> dict[str, Any]:
    """The `/v1/completions` body that continues `body`'s answer after `resume.token_ids`."""
    sent = len(resume.token_ids)
    out = {k: v for k, v in body.items() if k in CARRIED}
    out["prompt"] = [*resume.start.prompt_token_ids, *resume.token_ids]
    out["return_token_ids"] = True  # resumable again
    for name in MAX_TOKENS_FIELDS:
        if isinstance(body.get(name), int):
            out["max_tokens"] = max(1, body[name] - sent)
    for name in COUNTED:
        if isinstance(body.get(name), int):
            out[name] = max(0, body[name] - sent)
    return out


@dataclass
class Progress:
    """A tracked stream, as far as its client has it: what a resume needs. The ids stay as the
    replicas sent them until a resume reads them."""

    max_resumes: int
    start: StreamStart | None = None
    token_ids: list[RawIds] = field(default_factory=list)
    num_resumes: int = 0

    def add(self, raw: RawIds) -> None:
        if raw:
            self.token_ids.append(raw)

    def can_resume(self) -> bool:
        return self.start is not None and self.num_resumes < self.max_resumes

    def resume(self) -> Resume:
        assert self.start is not None
        self.num_resumes += 1
        ids = parse_ids(self.token_ids)
        self.token_ids = [b",".join(str(i).encode() for i in ids)] if ids else []
        return Resume(self.start, ids)
