"""The routes of OpenAI's Responses API: POST /v1/responses (also under a rollout-scoped base
URL), and a stored response read (GET) or forgotten (DELETE) by its id."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from art_backend.serving._answer import add_generation_routes, answer
from art_backend.serving.chat._service import ChatService
from art_backend.serving.responses._service import ResponsesService


def attach_response_routes(app: FastAPI | APIRouter, service: ChatService) -> None:
    """Add the Responses routes, translated onto `service`'s chat completions, to `app`."""
    router = APIRouter()
    # The Responses API, translated onto chat completions (records, tools, engines unchanged).
    responses = ResponsesService(service)

    async def create_response(raw: Request, rollout_id: str | None):
        return await answer(raw, rollout_id, responses.parse, responses.stream, responses.create)

    names = ("create_plain_response", "create_rollout_response")
    add_generation_routes(router, "/v1/responses", create_response, names=names)

    @router.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return responses.get(response_id)

    @router.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return responses.delete(response_id)

    app.include_router(router)
