"""The load client of the benchmarks, the chaos suite and the integration tests: one OpenAI
request (chat or completions, streamed when the body says `"stream": true`) over httpx, and
what came back as a plain record (`Reply`). How a caller judges a reply (goodput, chaos's
clean / sse_error / hang outcomes, a test's assertions) stays with the caller.

    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        r = await send(c, "/v1/completions", {"model": m, "prompt": "Hi", "stream": True})
        r.status, r.ttft_s, r.completion_tokens, r.sse_error, r.done

Timing is time.monotonic(), from just before the request is sent: `first_chunk_s` to the first
stream chunk that is not an error (a completions stream's first token; a chat stream's first
chunk carries only the role), `ttft_s` to the first one carrying text. A transport error
(`httpx.HTTPError`) is recorded in `exc`, with `status` 0, unless the caller asks for it to be
raised. A 200 whose answer or stream chunk is not JSON raises: a server bug to see, not a record.

What does not use it, and why:
- `bench/relay_load.py`: raw sockets, the cheapest client, so that the machine's cores go to
  the serving path bench.relay_cost measures, not to parsing in the client;
- `bench/peers/`: vLLM's own `vllm.benchmarks.serve` (and its request function), the standard
  client every peer system is measured with;
- tests that leave mid-stream by closing the connection at a chosen chunk or cancel the task
  (test_disconnect_storm.py, test_batching_and_cancel.py's disconnect test, test_routing.py's
  client timeouts): the point is how the client leaves, which a finished record cannot say;
- tests that read the bytes of the protocol: SSE framing (the `error` event just before
  `[DONE]` in test_admission_overload.py's deadline test; test_observability.py,
  test_tracing.py, test_handles.py, test_api_fuzzing.py), streams compared chunk by chunk
  (test_vllm_parity.py), every header of a reply (helpers.send_at_once: `x-ratelimit-*`,
  `x-llmserve-tenant`, `x-max-tokens-clamped`), malformed bodies (test_hostile_input.py);
- synchronous calls one at a time (the tests' `http` fixture and `httpx.post`, e.g.
  test_routing.py's prefix turns; readiness probes; bench/ask_models.py and
  test_openai_api.py through the OpenAI SDK): a request whose whole response the caller
  inspects, not load. (test_engine_priority.py calls the engine's ASGI app in-process.)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Reply:
    """One request as the client saw it."""

    start_s: float  # time.monotonic() when sent
    end_s: float = 0.0  # when the reply ended (its last byte, or the transport error)
    status: int = 0  # the HTTP status; 0 when a transport error (`exc`) ended the exchange
    first_chunk_s: float | None = None  # seconds from start to the first model chunk
    ttft_s: float | None = None  # seconds from start to the first chunk with text
    text: str = ""  # every choice's text (completions) or content (chat), in arrival order
    finish_reason: str | None = None  # the last one a choice gave
    prompt_tokens: int = 0  # from `usage` (streams: with stream_options.include_usage)
    completion_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    replica: str | None = None  # x-replica (apps with http.debug_headers)
    route: str | None = None  # x-route (the same)
    retry_after: str | None = None  # Retry-After
    refused_by: str | None = None  # x-llmserve-refused-by: "shield" where HAProxy refused it
    body: bytes = b""  # a reply that did not stream: the JSON answer or error
    sse_error: str | None = None  # the data of a stream's error (the Router's `error` event,
    # or vLLM's data chunk with an "error"), the last if several
    done: bool = False  # the stream ended with `data: [DONE]`
    resumes: int = 0  # the stream resumed on another replica (http.debug_headers says so)
    exc: httpx.HTTPError | None = None

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s


async def send(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    timeout: Any = httpx.USE_CLIENT_DEFAULT,
    record_errors: bool = True,
) -> Reply:
    """POSTs `body` to `path` (relative to the client's base URL, or a whole URL). With
    `record_errors=False` a transport error propagates as httpx raised it."""
    r = Reply(start_s=time.monotonic())
    try:
        if body.get("stream"):
            async with client.stream(
                "POST", path, json=body, headers=headers, timeout=timeout
            ) as resp:
                _head(r, resp)
                if resp.status_code != 200:
                    r.body = await resp.aread()
                else:
                    await _read_stream(r, resp)
            r.end_s = time.monotonic()
        else:
            resp = await client.post(path, json=body, headers=headers, timeout=timeout)
            r.end_s = time.monotonic()
            _head(r, resp)
            r.body = resp.content
            if resp.status_code == 200:
                _read_whole(r, json.loads(r.body))
    except httpx.HTTPError as e:
        if not record_errors:
            raise
        r.end_s, r.status, r.exc = time.monotonic(), 0, e
    return r


def _head(r: Reply, resp: httpx.Response) -> None:
    r.status = resp.status_code
    r.replica = resp.headers.get("x-replica")
    r.route = resp.headers.get("x-route")
    r.retry_after = resp.headers.get("retry-after")
    r.refused_by = resp.headers.get("x-llmserve-refused-by")


async def _read_stream(r: Reply, resp: httpx.Response) -> None:
    event = None
    async for line in resp.aiter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
            continue
        if not line.startswith("data:"):
            if line.startswith(": resumed on replica"):
                r.resumes += 1
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            r.done = True
        elif event == "error":  # the Router's own error after the stream started
            r.sse_error = data
        else:
            chunk = json.loads(data)
            if "error" in chunk:  # vLLM's: a data chunk, as the OpenAI SDK reads it
                r.sse_error = data
            else:
                if r.first_chunk_s is None:
                    r.first_chunk_s = time.monotonic() - r.start_s
                _read_chunk(r, chunk)
        event = None


def _read_chunk(r: Reply, chunk: dict[str, Any]) -> None:
    for choice in chunk.get("choices") or []:
        piece = choice.get("text") or (choice.get("delta") or {}).get("content")
        if piece:
            if r.ttft_s is None:
                r.ttft_s = time.monotonic() - r.start_s
            r.text += piece
        if choice.get("finish_reason") is not None:
            r.finish_reason = choice["finish_reason"]
    if chunk.get("usage"):
        _read_usage(r, chunk["usage"])


def _read_whole(r: Reply, answer: dict[str, Any]) -> None:
    for choice in answer.get("choices") or []:
        r.text += choice.get("text") or (choice.get("message") or {}).get("content") or ""
        if choice.get("finish_reason") is not None:
            r.finish_reason = choice["finish_reason"]
    if answer.get("usage"):
        _read_usage(r, answer["usage"])


def _read_usage(r: Reply, usage: dict[str, Any]) -> None:
    r.prompt_tokens = usage.get("prompt_tokens") or 0
    r.completion_tokens = usage.get("completion_tokens") or 0
    r.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
