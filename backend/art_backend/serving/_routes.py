"""The OpenAI protocol's routes over one chat service: chat completions, (legacy) completions
and responses (also under a rollout-scoped base URL), Anthropic's messages beside them, the stored records and
rollouts, the served models, adapters.

Generation routes read their body themselves (parsed off the event loop when large, so other
clients do not stall) and are cancelled when the client goes away; the rest are declared models.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from art_backend._errors import CompletionNotFoundError, InvalidNameError, InvalidRequestError
from art_backend._limits import CheckedJsonRoute, parse_json_object
from art_backend._unicode import TolerantJSONResponse
from art_backend.engines._adapter_files import ADAPTER_CONFIG, ADAPTER_SAFETENSORS
from art_backend.engines._chat_templates import has_chat_template
from art_backend.serving._chat import ChatService
from art_backend.serving._completions import CompletionsService
from art_backend.serving._completions_schemas import CompletionRequest
from art_backend.serving._messages import MessagesService, in_anthropic_shape
from art_backend.serving._messages_schemas import (
    CountTokensRequest,
    MessageCreateRequest,
    inline_json_schema,
)
from art_backend.serving._responses import ResponsesService
from art_backend.serving._schemas import (
    ChatCompletionRequest,
    LoadAdapterRequest,
    LookupCompletionsRequest,
)
from art_backend.store._records import validate_rollout_id
from art_core.names import is_adapter_name

DISCONNECT_POLL_SECONDS = 0.5
PARSE_ON_LOOP_MAX_BYTES = 256 * 1024  # larger bodies are parsed on a worker thread

RequestT = TypeVar("RequestT")


def serving_router(service: ChatService, art_path: Path) -> APIRouter:
    """The protocol's routes bound to one chat service; adapters load from inside `art_path`."""
    router = APIRouter()

    # ----------------------------------------------------------------------------- completions

    async def chat_completions(raw: Request, rollout_id: str | None = None):
        return await _answer(raw, rollout_id, _parse_chat_request, service.stream, service.complete)

    @router.post("/v1/chat/completions")
    async def create_chat_completion(raw: Request):
        return await chat_completions(raw)

    @router.post("/rollouts/{rollout_id}/v1/chat/completions")
    async def create_rollout_chat_completion(rollout_id: str, raw: Request):
        return await chat_completions(raw, rollout_id)

    @router.post("/v1/chat/completions/lookup")
    async def lookup_chat_completions(body: LookupCompletionsRequest):
        # One request for many records: the Langfuse exporter reads a step's calls with it.
        records = service.records.get_many(body.ids)
        found = {record["id"] for record in records}
        return await _encoded_off_loop(
            {
                "object": "list",
                "data": records if body.tokens else [_without_tokens(r) for r in records],
                "missing": [i for i in body.ids if i not in found],
            }
        )

    @router.get("/v1/chat/completions/{completion_id}")
    async def get_chat_completion(completion_id: str):
        record = service.records.get(completion_id)
        if record is None:
            raise CompletionNotFoundError(
                f"No completion {completion_id!r}: it was never served here, or it was evicted "
                "(the eviction rule: docs/serving.md, 'Exact-token capture'; evictions are "
                "counted on /metrics)."
            )
        return await _encoded_off_loop(record)

    @router.get("/v1/rollouts/{rollout_id}")
    async def get_rollout(rollout_id: str):
        validate_rollout_id(rollout_id)
        records = service.records.rollout(rollout_id)
        return await _encoded_off_loop(
            {"object": "rollout", "id": rollout_id, "completions": records}
        )

    @router.delete("/v1/rollouts/{rollout_id}")
    async def discard_rollout(rollout_id: str):
        # A rollout that failed is not trained: its records are released now, not in an hour.
        validate_rollout_id(rollout_id)
        discarded = service.records.discard_rollout(rollout_id)
        return {"object": "rollout.deleted", "id": rollout_id, "discarded": len(discarded)}

    # ------------------------------------------------------------------- completions (legacy)

    # OpenAI's Completions API: plain text in, no chat template (base models); same records.
    completions = CompletionsService(service)
    completion_body = _body_description(CompletionRequest)

    async def create_completion(raw: Request, rollout_id: str | None = None):
        parse, stream, complete = completions.parse, completions.stream, completions.complete
        return await _answer(raw, rollout_id, parse, stream, complete)

    @router.post("/v1/completions", openapi_extra=completion_body)
    async def create_plain_completion(raw: Request):
        return await create_completion(raw)

    @router.post("/rollouts/{rollout_id}/v1/completions", openapi_extra=completion_body)
    async def create_rollout_completion(rollout_id: str, raw: Request):
        return await create_completion(raw, rollout_id)

    # ------------------------------------------------------------------------------- responses

    # The Responses API, translated onto chat completions (records, tools, engines unchanged).
    responses = ResponsesService(service)

    async def create_response(raw: Request, rollout_id: str | None = None):
        return await _answer(raw, rollout_id, responses.parse, responses.stream, responses.create)

    @router.post("/v1/responses")
    async def create_plain_response(raw: Request):
        return await create_response(raw)

    @router.post("/rollouts/{rollout_id}/v1/responses")
    async def create_rollout_response(rollout_id: str, raw: Request):
        return await create_response(raw, rollout_id)

    @router.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return responses.get(response_id)

    @router.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return responses.delete(response_id)

    # -------------------------------------------------------------------------------- messages

    # Anthropic's Messages API, translated onto chat completions; errors in Anthropic's shape.
    messages = MessagesService(service)
    body_description = _body_description(MessageCreateRequest)

    async def create_message(raw: Request, rollout_id: str | None = None):
        work = _answer(raw, rollout_id, messages.parse, messages.stream, messages.create)
        return await in_anthropic_shape(work)

    @router.post("/v1/messages", openapi_extra=body_description)
    async def create_plain_message(raw: Request):
        return await create_message(raw)

    @router.post("/rollouts/{rollout_id}/v1/messages", openapi_extra=body_description)
    async def create_rollout_message(rollout_id: str, raw: Request):
        return await create_message(raw, rollout_id)

    count_schema = inline_json_schema(CountTokensRequest)
    count_description = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": count_schema}},
        }
    }

    async def count_message_tokens(raw: Request):
        _, request = await _parsed_request(raw, None, messages.parse_count)
        return await messages.count_tokens(request)

    @router.post("/v1/messages/count_tokens", openapi_extra=count_description)
    async def count_tokens(raw: Request):
        return await in_anthropic_shape(count_message_tokens(raw))

    @router.post("/rollouts/{rollout_id}/v1/messages/count_tokens", openapi_extra=count_description)
    async def count_rollout_tokens(rollout_id: str, raw: Request):
        return await in_anthropic_shape(count_message_tokens(raw))

    # ---------------------------------------------------------------------------------- models

    async def list_models():
        # Without a chat template (a base model) only /v1/completions can serve it.
        chat = has_chat_template(service.engine.tokenizer)
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "art",
                    "chat_template": chat,
                }
                for name in service.served_models()
            ],
        }

    router.get("/v1/models")(list_models)
    router.get("/rollouts/{rollout_id}/v1/models")(list_models)

    async def load_adapter(body: LoadAdapterRequest):
        if not is_adapter_name(body.name):
            raise InvalidNameError(
                f"Invalid adapter name {body.name!r}: use `<name>@<step>` with letters, digits, "
                "'.', '_' or '-' in the name.",
                param="name",
            )
        root = art_path.resolve()
        try:
            # A NUL byte or an over-long name raises here rather than naming a missing folder.
            path = Path(body.path).resolve()
            found = path.is_relative_to(root) and (path / "adapter_config.json").is_file()
        except (ValueError, OSError) as error:
            raise InvalidRequestError(
                f"Adapter path {body.path!r} is not a usable path: {error}.", param="path"
            ) from error
        if not path.is_relative_to(root):
            raise InvalidNameError(
                f"Adapter path {body.path!r} is outside the server's --path {str(root)!r}.",
                param="path",
            )
        if not found:
            raise InvalidRequestError(
                f"No PEFT adapter at {body.path!r} (adapter_config.json missing).", param="path"
            )
        # The folder is inside --path; the files PEFT reads must be too (not links out of it).
        for name in (ADAPTER_CONFIG, ADAPTER_SAFETENSORS):
            if not (path / name).resolve().is_relative_to(root):
                raise InvalidNameError(
                    f"Adapter file {name} in {body.path!r} links outside the server's --path "
                    f"{str(root)!r}; copy the file into the folder instead.",
                    param="path",
                )
        # Loading takes the engine lock between steps: keep the event loop free meanwhile.
        await asyncio.to_thread(service.engine.load_adapter, body.name, path)
        return {"id": body.name, "object": "model"}

    router.add_api_route(
        "/v1/adapters", load_adapter, methods=["POST"], route_class_override=CheckedJsonRoute
    )

    return router


def _body_description(model: type[BaseModel]) -> dict[str, Any]:
    """The API description of a generation route that reads its body itself: the JSON body it
    validates with `model`, and its answer streamed as server-sent events when asked."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_json_schema(model)}},
        },
        "responses": {"200": {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
    }


async def _encoded_off_loop(content: Any) -> Response:
    """Stored records as a JSON answer, encoded on a worker thread with the plain encoder.

    FastAPI's encoder walks every token id in Python on the event loop: one 3.8 MB record held
    every other request 3-9 s. `json.dumps` takes tens of milliseconds for it.
    """
    return await asyncio.to_thread(TolerantJSONResponse, content)


async def _parsed_request(
    raw: Request, rollout_id: str | None, parse: Callable[[bytes], RequestT]
) -> tuple[str | None, RequestT]:
    """The rollout id (the rollout-scoped URL wins over the header, both validated) and the body
    parsed by `parse`; megabytes are parsed off the event loop so other clients do not stall."""
    rollout_id = rollout_id or raw.headers.get("x-rollout-id")
    if rollout_id is not None:
        validate_rollout_id(rollout_id)
    body = await raw.body()
    if len(body) > PARSE_ON_LOOP_MAX_BYTES:
        return rollout_id, await asyncio.to_thread(parse, body)
    return rollout_id, parse(body)


async def _answer(
    raw: Request,
    rollout_id: str | None,
    parse: Callable[[bytes], Any],
    stream: Callable[[Any, str | None], Awaitable[AsyncIterator[str]]],
    complete: Callable[[Any, str | None], Coroutine[Any, Any, Any]],
) -> Any:
    """One generation route (chat completions, responses, messages): parse the body, then
    stream it as server-sent events or answer once, cancelled if the client goes away."""
    rollout_id, request = await _parsed_request(raw, rollout_id, parse)
    if request.stream:
        events = await stream(request, rollout_id)
        return StreamingResponse(events, media_type="text/event-stream")
    return await _unless_disconnected(raw, complete(request, rollout_id))


async def _unless_disconnected(raw: Request, work: Coroutine[Any, Any, Any]) -> Any:
    """Await `work`, cancelling it (and so its rows in the engine) if the client goes away."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
        if done:
            return task.result()
        if await raw.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return Response(status_code=499)  # nobody reads it; nginx's "client closed request"


def _parse_chat_request(body: bytes) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(parse_json_object(body)).came_in(len(body))


_TOKEN_FIELDS = ("token_ids", "logprobs", "prompt_token_ids")


def _without_tokens(record: dict[str, Any]) -> dict[str, Any]:
    choices = [
        {key: value for key, value in choice.items() if key not in _TOKEN_FIELDS}
        for choice in record["choices"]
    ]
    kept = {key: value for key, value in record.items() if key != "prompt_token_ids"}
    return {**kept, "choices": choices}
