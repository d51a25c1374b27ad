"""The routes of OpenAI's (legacy) Completions API: POST /v1/completions, and the same under a
rollout-scoped base URL. Plain text in, no chat template (base models); the same records."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from art_backend.serving._answer import add_generation_routes, answer, body_description
from art_backend.serving.chat._service import ChatService
from art_backend.serving.completions._schemas import CompletionRequest
from art_backend.serving.completions._service import CompletionsService


def attach_completion_routes(app: FastAPI | APIRouter, service: ChatService) -> None:
    """Add the completion routes, served with `service`'s engine and records, to `app`."""
    router = APIRouter()
    completions = CompletionsService(service)

    async def create_completion(raw: Request, rollout_id: str | None):
        parse, stream, complete = completions.parse, completions.stream, completions.complete
        return await answer(raw, rollout_id, parse, stream, complete)

    add_generation_routes(
        router,
        "/v1/completions",
        create_completion,
        names=("create_plain_completion", "create_rollout_completion"),
        openapi_extra=body_description(CompletionRequest),
    )
    app.include_router(router)
