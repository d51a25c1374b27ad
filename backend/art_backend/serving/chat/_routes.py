"""The routes of Chat Completions: POST /v1/chat/completions, and the same under a rollout-scoped
base URL (`/rollouts/{rollout_id}/v1`)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from art_backend.serving._answer import add_generation_routes, answer
from art_backend.serving._request import parse_request
from art_backend.serving.chat._schemas import ChatCompletionRequest
from art_backend.serving.chat._service import ChatService


def attach_chat_routes(app: FastAPI | APIRouter, service: ChatService) -> None:
    """Add the chat completion routes, served by `service`, to `app`."""
    router = APIRouter()

    async def chat_completions(raw: Request, rollout_id: str | None):
        return await answer(raw, rollout_id, _parse, service.stream, service.complete)

    names = ("create_chat_completion", "create_rollout_chat_completion")
    add_generation_routes(router, "/v1/chat/completions", chat_completions, names=names)
    app.include_router(router)


def _parse(body: bytes) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, body)
