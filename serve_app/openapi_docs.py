"""What /openapi.json says about the routes that read their body raw: the request schema and
every error status, in the OpenAI error shape. Pure data for FastAPI's `openapi_extra`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# What a generation route may answer besides 200; a 500 is never intended, so it is not listed.
ERROR_STATUSES = {
    400: "Bad input: the body, a field (`param` names it), or a prompt past the context window.",
    401: "Missing, malformed or unknown API key (where a key is required).",
    404: "Unknown model, or one this tenant may not use.",
    413: "Body larger than `http.max_request_body_bytes`.",
    429: "Over the tenant's rate or concurrency limit; see `Retry-After`.",
    503: "Overloaded (queue full or too long a wait) or no healthy replica; see `Retry-After`.",
    504: "The request's deadline passed.",
}
_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": "string"}},
    }},
}  # fmt: skip


# One event of a `stream: true` answer (OpenAPI 3.1 reads a text/event-stream schema per event):
# `data:` a chunk as JSON, then `data: [DONE]`; a failure mid-stream is an `event: error`.
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"enum": ["message", "error"]}},
}


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its `$defs` inlined (they are not recursive here), so that it
    stands alone inside an OpenAPI document."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(defs[node["$ref"].rsplit("/", 1)[1]])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def openapi_extra(request_model: type[BaseModel] | None = None,
                  errors: tuple[int, ...] = tuple(ERROR_STATUSES)) -> dict[str, Any]:  # fmt: skip
    """FastAPI `openapi_extra` for a route: the JSON body it reads (the routes take the raw
    request, so FastAPI cannot see it) and every error it may answer, so that /openapi.json
    documents the API that is served."""
    content = {"application/json": {"schema": _ERROR_SCHEMA}}
    extra: dict[str, Any] = {"responses": {
        str(code): {"description": ERROR_STATUSES[code], "content": content} for code in errors}}
    if request_model is not None:
        schema = _inline_refs(request_model.model_json_schema())
        extra["requestBody"] = {"required": True,
                                "content": {"application/json": {"schema": schema}}}
        extra["responses"]["200"] = {"content": {"text/event-stream": {"schema": _SSE_EVENT}}}
    return extra  # fmt: skip
