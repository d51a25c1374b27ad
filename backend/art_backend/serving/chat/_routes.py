"""The routes of Chat Completions: POST /v1/chat/completions, and the same under a rollout-scoped
base URL (`/rollouts/{rollout_id}/v1`)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from art_backend.serving._answer import answer
from art_backend.serving._request import parse_request
from art_backend.serving.chat._schemas import ChatCompletionRequest
from art_backend.serving.chat._service import ChatService


def attach_chat_routes(app: FastAPI | APIRouter, service: ChatService) -> None:
    """Add the chat completion routes, served by `service`, to `app`."""
    router = APIRouter()

    async def chat_completions(raw: Request, rollout_id: str | None = None):
        return await answer(raw, rollout_id, _parse, service.stream, service.complete)

    @router.post("/v1/chat/completions")
    async def create_chat_completion(raw: Request):
        return await chat_completions(raw)

    @router.post("/rollouts/{rollout_id}/v1/chat/completions")
    async def create_rollout_chat_completion(rollout_id: str, raw: Request):
        return await chat_completions(raw, rollout_id)

    app.include_router(router)


def _parse(body: bytes) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, body)
