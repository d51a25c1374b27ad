"""The routes of the stored records, whatever protocol served them: one completion
(GET /v1/chat/completions/{id}), many at once (POST /v1/chat/completions/lookup), a rollout's
(GET /v1/rollouts/{id}) and a failed rollout's released (DELETE /v1/rollouts/{id})."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from art_backend._errors import CompletionNotFoundError
from art_backend._unicode import TolerantJSONResponse
from art_backend.serving.chat._service import ChatService
from art_backend.store._records import validate_rollout_id

_TOKEN_FIELDS = ("token_ids", "logprobs", "prompt_token_ids")


class LookupCompletionsRequest(BaseModel):
    """POST /v1/chat/completions/lookup: many stored records in one request (exporters, review)."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(max_length=10_000)
    # False leaves out the token ids and logprobs (most of a record's size) when only the
    # request, the answer, the usage and the timing are wanted.
    tokens: bool = True


def attach_record_routes(app: FastAPI | APIRouter, service: ChatService) -> None:
    """Add the routes that read (and release) `service`'s stored records to `app`."""
    router = APIRouter()

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

    app.include_router(router)


async def _encoded_off_loop(content: Any) -> Response:
    """Stored records as a JSON answer, encoded on a worker thread with the plain encoder.

    FastAPI's encoder walks every token id in Python on the event loop: one 3.8 MB record held
    every other request 3-9 s. `json.dumps` takes tens of milliseconds for it.
    """
    return await asyncio.to_thread(TolerantJSONResponse, content)


def _without_tokens(record: dict[str, Any]) -> dict[str, Any]:
    choices = [
        {key: value for key, value in choice.items() if key not in _TOKEN_FIELDS}
        for choice in record["choices"]
    ]
    kept = {key: value for key, value in record.items() if key != "prompt_token_ids"}
    return {**kept, "choices": choices}
