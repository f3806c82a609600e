"""A resumable stream's frames on the replica: its token ids taken out, or its continuation
reframed (llmserve/policies/resume.py says which streams and how they resume).

A tracked stream asks vLLM for `return_token_ids`: every chunk then names the ids whose text it
carries, the first one the prompt's. `TokenTap` takes them out (each `"token_ids":[...]`
becomes the `null` vLLM writes when not asked, so the client's bytes are what they would have
been) and hands them to the Router with the bytes. `Continuation` turns the completion chunks
of a resumed answer into the chunks of the stream it continues: its id, creation time and kind,
and usage that counts the whole answer once.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from llmserve.policies.resume import continuation_body
from llmserve.protocol.replica_call import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    RawIds,
    ReplicaRequest,
    ReplyEnd,
    ReplyHead,
    StreamStart,
    parse_ids,
    reply_part,
)

TOKEN_IDS = re.compile(rb'"token_ids":\[([0-9, ]*)\]')
NULL_IDS = b'"token_ids":null'  # what vLLM writes where they were not asked for
PROMPT_IDS = re.compile(rb'"prompt_token_ids":\[([0-9, ]*)\]')
CHUNK_ID = re.compile(rb'"id":"([^"]*)"')
CREATED = re.compile(rb'"created":([0-9]+)')
# A chat chunk vLLM sends only because token ids were asked for: no text (held back while it
# may be the start of a longer character), not the last. Without the ids it is not sent.
EMPTY_DELTA = b'"delta":{}'
# A chunk whose token(s) brought no text yet (part of a character): chat's or completions'.
TEXTLESS = (EMPTY_DELTA, b'"delta":{"content":""}', b'"text":""')
FRAME_END = b"\n\n"


def _frames(data: bytes) -> list[bytes]:
    return [f + FRAME_END for f in data.split(FRAME_END) if f]


class Pending:
    """Token ids whose text the client does not have yet: a character that spans tokens comes
    out with its last one. They go to the Router with the chunk that brings their text; a
    stream that breaks before resumes without them (the continuation makes them again), since
    an engine whose prompt ends inside a character would not say it right."""

    def __init__(self) -> None:
        self._ids: list[RawIds] = []

    def add(self, ids: RawIds, textless: bool) -> RawIds:
        if textless:
            if ids:
                self._ids.append(ids)
            return b""
        if not self._ids:
            return ids
        out = b",".join([*self._ids, ids] if ids else self._ids)
        self._ids = []
        return out


class TokenTap:
    def __init__(self) -> None:
        self.start: StreamStart | None = None
        self._pending = Pending()

    def take(self, data: bytes, failed: bool = False) -> tuple[bytes, RawIds]:
        """The bytes as the client gets them, and the token ids whose text they carry. A failed
        reply keeps only its chunks: the engine's error frame is the Router's to send, or not
        (it resumes the stream instead)."""
        if self.start is None:
            data = self._first(data)
        if not failed and not any(t in data for t in TEXTLESS):
            # Every chunk brings text (nearly all of them): two passes of C over the bytes.
            ids = b",".join(TOKEN_IDS.findall(data))
            return TOKEN_IDS.sub(NULL_IDS, data), self._pending.add(ids, False)
        out: list[bytes] = []
        pieces: list[RawIds] = []
        for frame in _frames(data):
            if not frame.startswith(b'data: {"id"'):
                if not failed:
                    out.append(frame)
                continue
            found = b",".join(TOKEN_IDS.findall(frame))
            frame = TOKEN_IDS.sub(NULL_IDS, frame)
            last = b'"finish_reason":null' not in frame
            textless = any(t in frame for t in TEXTLESS)
            if ids := self._pending.add(found, textless and not last):
                pieces.append(ids)
            if not (EMPTY_DELTA in frame and not last):  # vLLM sends it only for the ids
                out.append(frame)
        return b"".join(out), b",".join(pieces)

    def _first(self, data: bytes) -> bytes:
        prompt = PROMPT_IDS.search(data)
        chunk_id, created = CHUNK_ID.search(data), CREATED.search(data)
        if prompt is None or chunk_id is None:
            return data  # not a tracked chunk (an error): nothing to resume from
        self.start = StreamStart(
            chunk_id.group(1).decode(),
            int(created.group(1)) if created else 0,
            parse_ids([prompt.group(1)]),
        )
        return PROMPT_IDS.sub(b'"prompt_token_ids":null', data, count=1)


class Continuation:
    """Completion chunks of a resumed answer, as chunks of the stream it continues (`path`)."""

    def __init__(self, path: str, start: StreamStart, num_sent: int) -> None:
        self._chat = path == CHAT_PATH
        self._start = start
        self._num_sent = num_sent
        self._pending = Pending()

    def take(self, data: bytes, failed: bool = False) -> tuple[bytes, RawIds]:
        out: list[bytes] = []
        ids: list[RawIds] = []
        for frame in _frames(data):
            if not frame.startswith(b"data: {"):
                if not failed:
                    out.append(frame)  # [DONE]
                continue
            chunk = json.loads(frame[6:])
            if "choices" not in chunk:  # an error: the Router's to send, or not
                if not failed:
                    out.append(frame)
                continue
            chunk = self._reframe(chunk, ids)
            if chunk is not None:
                out.append(b"data: " + _dumps(chunk) + FRAME_END)
        return b"".join(out), b",".join(i for i in ids if i)

    def _reframe(self, chunk: dict[str, Any], ids: list[RawIds]) -> dict[str, Any] | None:
        start = self._start
        head = {"id": start.chunk_id, "created": start.created}
        usage = chunk.get("usage")
        if usage:
            new = usage.get("completion_tokens", 0)
            prompt = len(start.prompt_token_ids)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": self._num_sent + new,
                "total_tokens": prompt + self._num_sent + new,
            }
        for choice in chunk["choices"]:
            textless = not choice.get("text") and choice.get("finish_reason") is None
            raw = b",".join(str(i).encode() for i in choice.get("token_ids") or ())
            ids.append(self._pending.add(raw, textless))
        if not self._chat:
            for choice in chunk["choices"]:
                choice["token_ids"] = None
                choice["prompt_token_ids"] = None
            return {**chunk, **head, **({"usage": usage} if usage else {})}
        choices = []
        for choice in chunk["choices"]:
            text, finish = choice.get("text") or "", choice.get("finish_reason")
            if not text and finish is None:
                continue  # held back: vLLM's chat stream sends nothing for it
            choices.append(
                {
                    "index": choice.get("index", 0),
                    "delta": {"content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                    **({"stop_reason": choice["stop_reason"]} if finish is not None else {}),
                    "token_ids": None,
                }
            )
        if not choices and not usage:
            return None
        out = {
            "id": start.chunk_id,
            "object": "chat.completion.chunk",
            "created": start.created,
            "model": chunk.get("model"),
            "choices": choices,
        }
        if usage:
            out["usage"] = usage
        return out


def _dumps(obj: dict[str, Any]) -> bytes:
    # As vLLM writes its chunks (pydantic's JSON): compact, UTF-8 unescaped.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class TrackedReply:
    """A tracked request on the replica: what its engine is asked (a resumed one: the
    continuation), and each reply item as the Router gets it (ids beside the bytes)."""

    def __init__(self, request: ReplicaRequest) -> None:
        self._resume = request.resume
        if self._resume is None:
            self._tap: TokenTap | Continuation = TokenTap()
            self.engine_request = request
            return
        body = continuation_body(json.loads(request.body), self._resume)
        self._tap = Continuation(request.path, self._resume.start, len(self._resume.token_ids))
        self.engine_request = dataclasses.replace(request, path=COMPLETIONS_PATH, body=_dumps(body))

    def item(self, part: ReplyHead | bytes | ReplyEnd) -> ReplyHead | bytes | ReplyEnd:
        if isinstance(part, bytes):
            return reply_part(*self._tap.take(part))
        if isinstance(part, ReplyHead):
            if not part.is_stream:
                return part  # an error answer, or a refusal: nothing to track
            body, ids = self._tap.take(part.body)
            start = self._resume.start if self._resume else self._tap.start  # type: ignore[union-attr]
            return dataclasses.replace(part, body=body, token_ids=ids, stream_start=start)
        body, ids = self._tap.take(part.body, failed=part.failed)
        usage = part.usage
        if self._resume is not None:  # the answer so far was the continuation's prompt
            sent = len(self._resume.token_ids)
            usage = dataclasses.replace(
                usage,
                num_prompt_tokens=max(0, usage.num_prompt_tokens - sent),
                num_completion_tokens=usage.num_completion_tokens + sent,
            )
        return dataclasses.replace(part, body=body, token_ids=ids, usage=usage)
