"""/openapi.json: the platform's routes with vLLM's own request schemas merged in (pure)."""

from __future__ import annotations

from fastapi import FastAPI, Request

from llmserve.router import openapi_docs

ENGINE_DOC = {
    "paths": {
        "/v1/chat/completions": {
            "post": {
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}
                        }
                    }
                }
            }
        }
    },
    "components": {
        "schemas": {
            "ChatCompletionRequest": {
                "type": "object",
                "properties": {
                    "messages": {
                        "type": "array",
                        "items": {"$ref": "#/components/schemas/Message"},
                    },
                    "logprobs": {"type": "boolean"},
                },
            },
            "Message": {"type": "object", "properties": {"role": {"type": "string"}}},
            "Unrelated": {"type": "object"},
        }
    },
}


def app() -> FastAPI:
    a = FastAPI(openapi_url=None)

    @a.post("/v1/chat/completions", openapi_extra=openapi_docs.route_extra("/v1/chat/completions"))
    async def chat(request: Request):
        return {}

    @a.get("/v1/models", openapi_extra=openapi_docs.route_extra(errors=(401,)))
    async def models():
        return {}

    return a


def test_forwarded_routes_get_vllms_schema_and_the_timeout_extension():
    doc = openapi_docs.document(app(), ENGINE_DOC)
    op = doc["paths"]["/v1/chat/completions"]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    schemas = doc["components"]["schemas"]
    assert {"ChatCompletionRequest", "Message"} <= set(schemas)  # what it refers to, too
    assert "Unrelated" not in schemas
    props = schemas["ChatCompletionRequest"]["properties"]
    assert "logprobs" in props and props["timeout"] == openapi_docs.TIMEOUT_PROPERTY
    assert {"400", "401", "404", "413", "429", "503", "504"} <= set(op["responses"])
    assert set(doc["paths"]["/v1/models"]["get"]["responses"]) >= {"401"}


def test_without_an_engine_document_a_stand_in_schema_is_served():
    doc = openapi_docs.document(app(), None)
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert schema["required"] == ["model"] and "timeout" in schema["properties"]
