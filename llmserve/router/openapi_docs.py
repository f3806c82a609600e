"""What /openapi.json says: the platform's routes, with vLLM's own request schemas for the routes
it forwards, the platform's `timeout` extension, and every error status in the OpenAI shape.

The Router reads request bodies raw (it forwards them), so FastAPI cannot see their schemas; they
come from the engine's own OpenAPI document (a replica's vLLM app), fetched once. Until a replica
answers, a minimal schema stands in. Pure data: no Ray, no vLLM, no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from llmserve.protocol.openai_protocol import MAX_TIMEOUT_S
from llmserve.protocol.replica_call import FORWARDED_PATHS, GENERATION_PATHS

# What a forwarded route may answer besides 200; a 500 is never intended, so it is not listed.
ERROR_STATUSES = {
    400: "Bad input: the body or a field (`param` names it), as vLLM validates it.",
    401: "Missing, malformed or unknown API key.",
    404: "Unknown model, or one this tenant may not use (one answer for both).",
    413: "Body larger than `http.max_request_body_bytes`.",
    429: "Over the tenant's rate or concurrency limit; see `Retry-After`.",
    503: "Overloaded (queue full or too long a wait) or no healthy replica; see `Retry-After`.",
    504: "The request's deadline passed.",
}
_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer"]},
            },
        }
    },
}
# The platform's extension to vLLM's generation requests.
TIMEOUT_PROPERTY = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": MAX_TIMEOUT_S,
    "description": "The request's deadline in seconds (capped by the tenant's max_timeout_s); "
    "past it the request is aborted and answered 504.",
}
_STANDIN_BODY = {
    "type": "object",
    "required": ["model"],
    "properties": {"model": {"type": "string"}, "timeout": TIMEOUT_PROPERTY},
}


def route_extra(
    path: str | None = None, errors: tuple[int, ...] = tuple(ERROR_STATUSES)
) -> dict[str, Any]:
    """FastAPI `openapi_extra` for a route: its errors, and the stand-in body of a forwarded
    route (replaced by vLLM's schema in `document`)."""
    content = {"application/json": {"schema": _ERROR_SCHEMA}}
    extra: dict[str, Any] = {
        "responses": {
            str(code): {"description": ERROR_STATUSES[code], "content": content} for code in errors
        }
    }
    if path is not None:
        body = copy.deepcopy(_STANDIN_BODY)
        if path not in GENERATION_PATHS:
            del body["properties"]["timeout"]
        extra["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        extra["responses"]["200"] = {
            "description": "The engine's answer: JSON, or for "
            "`stream: true` SSE `data:` chunks ending in `data: [DONE]`.",
            "content": {"application/json": {}, "text/event-stream": {}},
        }
    return extra


def document(app: FastAPI, engine_doc: dict[str, Any] | None) -> dict[str, Any]:
    """The platform's OpenAPI document, with the engine's request schemas where it has them."""
    doc = get_openapi(title="llmserve", version="1", routes=app.routes)
    if not engine_doc:
        return doc
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    engine_schemas = engine_doc.get("components", {}).get("schemas", {})
    for path in FORWARDED_PATHS:
        ours = doc["paths"].get(path, {}).get("post")
        theirs = engine_doc.get("paths", {}).get(path, {}).get("post", {}).get("requestBody")
        if ours is None or theirs is None:
            continue
        body = copy.deepcopy(theirs)
        schema = body["content"]["application/json"]["schema"]
        for name in _referenced(schema, engine_schemas):
            schemas.setdefault(name, copy.deepcopy(engine_schemas[name]))
        if path in GENERATION_PATHS:
            for name in _top_level(schema):
                schemas[name].setdefault("properties", {})["timeout"] = TIMEOUT_PROPERTY
        ours["requestBody"] = body
    return doc


def _top_level(schema: dict[str, Any]) -> list[str]:
    """Names of the component schemas a request body is (itself, or any of a union)."""
    refs = [schema] + list(schema.get("anyOf", [])) + list(schema.get("oneOf", []))
    return [r["$ref"].rsplit("/", 1)[1] for r in refs if "$ref" in r]


def _referenced(node: Any, schemas: dict[str, Any], seen: set[str] | None = None) -> set[str]:
    """Every component schema `node` refers to, transitively."""
    seen = set() if seen is None else seen
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            if name not in seen and name in schemas:
                seen.add(name)
                _referenced(schemas[name], schemas, seen)
        for v in node.values():
            _referenced(v, schemas, seen)
    elif isinstance(node, list):
        for v in node:
            _referenced(v, schemas, seen)
    return seen


def models_list(served: dict[str, str], created: int) -> dict[str, Any]:
    """`served`: name -> the model that serves it; an adapter's card names its base as `parent`
    (vLLM's own /v1/models does the same)."""
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "llmserve"}
            | ({"parent": base} if base != n else {})
            for n, base in served.items()
        ],
    }
