"""The routes of Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, both
also under a rollout-scoped base URL (`/rollouts/{rollout_id}`); errors in Anthropic's shape."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from art_backend.serving._answer import answer, body_description, parsed_request, request_body
from art_backend.serving.chat._service import ChatService
from art_backend.serving.messages._schemas import CountTokensRequest, MessageCreateRequest
from art_backend.serving.messages._service import MessagesService, in_anthropic_shape


def attach_message_routes(app: FastAPI | APIRouter, service: ChatService) -> None:
    """Add the Messages routes, translated onto `service`'s chat completions, to `app`."""
    router = APIRouter()
    # Anthropic's Messages API, translated onto chat completions; errors in Anthropic's shape.
    messages = MessagesService(service)
    body_described = body_description(MessageCreateRequest)

    async def create_message(raw: Request, rollout_id: str | None = None):
        work = answer(raw, rollout_id, messages.parse, messages.stream, messages.create)
        return await in_anthropic_shape(work)

    @router.post("/v1/messages", openapi_extra=body_described)
    async def create_plain_message(raw: Request):
        return await create_message(raw)

    @router.post("/rollouts/{rollout_id}/v1/messages", openapi_extra=body_described)
    async def create_rollout_message(rollout_id: str, raw: Request):
        return await create_message(raw, rollout_id)

    count_description = request_body(CountTokensRequest)

    async def count_message_tokens(raw: Request):
        _, request = await parsed_request(raw, None, messages.parse_count)
        return await messages.count_tokens(request)

    @router.post("/v1/messages/count_tokens", openapi_extra=count_description)
    async def count_tokens(raw: Request):
        return await in_anthropic_shape(count_message_tokens(raw))

    @router.post("/rollouts/{rollout_id}/v1/messages/count_tokens", openapi_extra=count_description)
    async def count_rollout_tokens(rollout_id: str, raw: Request):
        return await in_anthropic_shape(count_message_tokens(raw))

    app.include_router(router)
