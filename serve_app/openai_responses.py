"""OpenAI response bodies: the non-streaming response, the SSE chunks and the model list, built
from the engine's GenerationChunks. Pure: no Ray, no vLLM, no I/O."""

from __future__ import annotations

import time
from typing import Any, Literal

from serve_app.generation import GenerationChunk


class ResponseBuilder:
    """Accumulates one request's chunks into OpenAI stream chunks and a final response."""

    def __init__(self, kind: Literal["chat", "completion"], response_id: str, model: str, n: int):
        self.kind = kind
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.texts = [""] * n
        self.finish = [None] * n
        self.num_prompt_tokens = 0
        self.num_completion_tokens = 0
        self._role_sent = [False] * n
        self._echo = ""
        self._echo_sent = [False] * n

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def add(self, chunk: GenerationChunk) -> list[dict[str, Any]]:
        """Records a chunk; returns the stream chunks (as dicts) it makes."""
        self.num_prompt_tokens = chunk.num_prompt_tokens
        if chunk.prompt_text is not None:
            self._echo = chunk.prompt_text
        out = []
        for c in chunk.choices:
            self.num_completion_tokens += c.num_tokens
            text = c.text
            if self._echo and not self._echo_sent[c.index]:  # every choice starts with the prompt
                text = self._echo + text
                self._echo_sent[c.index] = True
            self.texts[c.index] += text
            reason = _finish_reason(c.finish_reason)
            if reason:
                self.finish[c.index] = reason
            out.append(self._stream_choice(c.index, text, reason))
        return [self._chunk(out)] if out else []

    def _stream_choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        if self.kind == "completion":
            return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
        delta: dict[str, Any] = {"content": text}
        if not self._role_sent[index]:
            delta = {"role": "assistant", "content": text}
            self._role_sent[index] = True
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}

    def _chunk(self, choices: list[dict[str, Any]], usage: bool = False) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage:
            chunk["usage"] = self.usage()
        return chunk

    def usage_chunk(self) -> dict[str, Any]:
        return self._chunk([], usage=True)

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": self.num_completion_tokens,
            "total_tokens": self.num_prompt_tokens + self.num_completion_tokens,
        }

    def response(self) -> dict[str, Any]:
        if self.kind == "chat":
            choices = [
                {"index": i, "message": {"role": "assistant", "content": t},
                 "logprobs": None, "finish_reason": self.finish[i]}
                for i, t in enumerate(self.texts)
            ]  # fmt: skip
        else:
            choices = [
                {"index": i, "text": t, "logprobs": None, "finish_reason": self.finish[i]}
                for i, t in enumerate(self.texts)
            ]
        return {
            "id": self.id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }


def _finish_reason(engine_reason: str | None) -> str | None:
    # vLLM says "abort" when it stopped a request itself; to a client that is an error, reported
    # separately, so it never shows as a finish_reason.
    return engine_reason if engine_reason in ("stop", "length") else None




def models_list(names: list[str], created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "llmserve"}
            for n in names
        ],
    }
