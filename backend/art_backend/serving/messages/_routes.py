"""The routes of Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, both
also under a rollout-scoped base URL (`/rollouts/{rollout_id}`); errors in Anthropic's shape."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from art_backend.serving._answer import (
    add_generation_routes,
    answer,
    body_description,
    parsed_request,
    request_body,
)
from art_backend.serving.chat._service import ChatService
from art_backend.serving.messages._schemas import CountTokensRequest, MessageCreateRequest
from art_backend.serving.messages._service import MessagesService, in_anthropic_shape


def attach_message_routes(app: FastAPI | APIRouter, service: ChatService) -> None:
    """Add the Messages routes, translated onto `service`'s chat completions, to `app`."""
    router = APIRouter()
    # Anthropic's Messages API, translated onto chat completions; errors in Anthropic's shape.
    messages = MessagesService(service)

    async def create_message(raw: Request, rollout_id: str | None):
        work = answer(raw, rollout_id, messages.parse, messages.stream, messages.create)
        return await in_anthropic_shape(work)

    async def count_tokens(raw: Request, rollout_id: str | None):
        _, request = await parsed_request(raw, None, messages.parse_count)
        return await messages.count_tokens(request)

    add_generation_routes(
        router,
        "/v1/messages",
        create_message,
        names=("create_plain_message", "create_rollout_message"),
        openapi_extra=body_description(MessageCreateRequest),
    )
    add_generation_routes(
        router,
        "/v1/messages/count_tokens",
        lambda raw, rollout_id: in_anthropic_shape(count_tokens(raw, rollout_id)),
        names=("count_tokens", "count_rollout_tokens"),
        openapi_extra=request_body(CountTokensRequest),
    )
    app.include_router(router)
