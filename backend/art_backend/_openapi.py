"""The API description at `/openapi.json`: FastAPI's document, completed where it cannot see.

FastAPI documents what route signatures declare. It misses here:

- the chat and responses routes' request body: they read the raw body (to bound its size and
  parse it off the event loop) and validate `ChatCompletionRequest` / `ResponseCreateRequest`
  themselves, so FastAPI sees no body;
- the error answers: every 4xx is OpenAI's `{"error": {...}}` (`ErrorResponse`), a failed
  validation is a 400 (never FastAPI's 422), and a body over `--max-body-mb` a 413;
- what streams: chat completions and responses answer `text/event-stream` when `stream` is true, `train` and
  `sft` answer NDJSON events, `/metrics` is Prometheus text;
- the bearer key, declared only when the server has one (then every route but `/health` needs it).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from art_backend.serving.chat._schemas import ChatCompletionRequest
from art_backend.serving.responses._schemas import ResponseCreateRequest

# Routes that validate their raw JSON body themselves: path -> the schema of that body.
BODY_SCHEMAS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/rollouts/{rollout_id}/v1/chat/completions": ChatCompletionRequest,
    "/v1/responses": ResponseCreateRequest,
    "/rollouts/{rollout_id}/v1/responses": ResponseCreateRequest,
}
STREAMED = {
    "/v1/engine/generate": "application/x-ndjson",
    "/v1/training/models/{project}/{name}/train": "application/x-ndjson",
    "/v1/training/models/{project}/{name}/sft": "application/x-ndjson",
}
OPEN_PATHS = {"/health"}  # answered without the key

_SCHEMAS = "#/components/schemas/"
ERROR_SCHEMA: dict[str, Any] = {
    "title": "ErrorResponse",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "description": "What went wrong and what to do."},
                "type": {"type": "string", "examples": ["invalid_request_error"]},
                "param": {
                    "anyOf": [{"type": "string"}, {"type": "null"}],
                    "description": "The request field at fault, e.g. `messages[0].role`.",
                },
                "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
        }
    },
}
ERROR_ANSWERS = {
    "400": "Invalid request: the error's `param` names the field, the message what to change.",
    "401": "Missing or wrong API key (`Authorization: Bearer <key>`).",
    "403": "Refused: a cross-origin request that would change state.",
    "404": "Unknown model, completion, adapter or path.",
    "413": "The request body is larger than the server's `--max-body-mb`.",
}


def describe_api(app: FastAPI, *, keyed: bool) -> dict[str, Any]:
    """The OpenAPI document of `app`, built once and then served from `app.openapi_schema`."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorResponse"] = ERROR_SCHEMA
    for schema in dict.fromkeys(BODY_SCHEMAS.values()):
        _add_request_schema(schemas, schema)
    if keyed:
        document["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            _declare_path_parameters(path, operation)
            if path in BODY_SCHEMAS and method == "post":
                name = BODY_SCHEMAS[path].__name__
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": _SCHEMAS + name}}},
                }
                ok = operation["responses"]["200"]["content"]
                ok["text/event-stream"] = {"schema": {"type": "string"}}
            if path in STREAMED:
                operation["responses"]["200"]["content"] = {
                    STREAMED[path]: {"schema": {"type": "string"}}
                }
            if path == "/metrics":
                operation["responses"]["200"]["content"] = {
                    "text/plain": {"schema": {"type": "string"}}
                }
            if path not in OPEN_PATHS:
                _add_error_answers(operation, has_body="requestBody" in operation)
                if keyed:
                    operation["security"] = [{"apiKey": []}]
    app.openapi_schema = document
    return document


def _add_request_schema(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    request = model.model_json_schema(ref_template=_SCHEMAS + "{model}")
    for name, definition in request.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas[model.__name__] = request


def _declare_path_parameters(path: str, operation: dict[str, Any]) -> None:
    # A route may share a function that takes no path argument (the rollout-scoped model list).
    declared = {p["name"] for p in operation.get("parameters", []) if p.get("in") == "path"}
    for name in re.findall(r"{(\w+)}", path):
        if name not in declared:
            operation.setdefault("parameters", []).append(
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            )


def _add_error_answers(operation: dict[str, Any], *, has_body: bool) -> None:
    responses = operation["responses"]
    responses.pop("422", None)
    error = {"application/json": {"schema": {"$ref": _SCHEMAS + "ErrorResponse"}}}
    for status, description in ERROR_ANSWERS.items():
        if status == "413" and not has_body:
            continue
        responses.setdefault(status, {"description": description, "content": error})
