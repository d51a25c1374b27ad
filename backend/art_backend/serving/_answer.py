"""How every generation route answers (chat completions, completions, responses, messages): the
body read and parsed (off the event loop when large, so other clients do not stall), then the
answer streamed as server-sent events or given once, cancelled when the client goes away.

A streaming reader that stops reading without hanging up does not hold the engine (its rows run
to their end and are freed whatever the reader does), but its events would wait for it, up to
n × max_tokens of them, for as long as the connection stays open: once a send has waited
`STALLED_STREAM_SECONDS` (the socket's buffers full), the stream is dropped, its generation
cancelled if still running, and counted (`art_streams_stalled_total`).

Generation routes read their body themselves (to bound its size and parse it off the loop);
`body_description` writes the body they validate into the API description.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.types import Message, Send

from art_backend._limits import parse_off_loop
from art_backend.store._records import validate_rollout_id

logger = logging.getLogger(__name__)

DISCONNECT_POLL_SECONDS = 0.5
# A reader that takes no bytes of its stream for this long is gone in all but name: an SSE
# client reads as the events come, and the socket buffers hundreds of kilobytes before a send
# has to wait at all.
STALLED_STREAM_SECONDS = 60.0

RequestT = TypeVar("RequestT")


async def parsed_request(
    raw: Request, rollout_id: str | None, parse: Callable[[bytes], RequestT]
) -> tuple[str | None, RequestT]:
    """The rollout id (the rollout-scoped URL wins over the header, both validated) and the body
    parsed by `parse`; megabytes are parsed off the event loop so other clients do not stall."""
    rollout_id = rollout_id or raw.headers.get("x-rollout-id")
    if rollout_id is not None:
        validate_rollout_id(rollout_id)
    return rollout_id, await parse_off_loop(await raw.body(), parse)


async def answer(
    raw: Request,
    rollout_id: str | None,
    parse: Callable[[bytes], Any],
    stream: Callable[[Any, str | None], Coroutine[Any, Any, AsyncIterator[str]]],
    complete: Callable[[Any, str | None], Coroutine[Any, Any, Any]],
) -> Any:
    """One generation route (chat completions, completions, responses, messages): parse the body, then
    stream it as server-sent events or answer once, cancelled if the client goes away."""
    rollout_id, request = await parsed_request(raw, rollout_id, parse)
    if request.stream:
        # Preparing (a grammar's compile may wait in its lane) stops too if the client goes.
        events = await unless_disconnected(raw, stream(request, rollout_id))
        if isinstance(events, Response):
            return events
        # The app's ChatService counts the streams dropped (art_streams_stalled_total).
        return StallBoundedStream(events, getattr(raw.app.state, "service", None))
    return await unless_disconnected(raw, complete(request, rollout_id))


class StallBoundedStream(StreamingResponse):
    """Server-sent events whose reader must keep taking them: a send that waits
    `STALLED_STREAM_SECONDS` ends the stream (its events let go, a generation still running
    cancelled by the events' own `finally`), counted in `service.stalled_streams`. The server
    then closes the connection (uvicorn logs that the response was not completed)."""

    def __init__(self, events: AsyncIterator[str], service: Any) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._service = service

    async def stream_response(self, send: Send) -> None:
        stalled = False

        async def bounded(message: Message) -> None:
            nonlocal stalled
            try:
                async with asyncio.timeout(STALLED_STREAM_SECONDS):
                    await send(message)
            except TimeoutError:
                stalled = True
                raise

        try:
            await super().stream_response(bounded)
        except TimeoutError:
            if not stalled:
                raise
            if self._service is not None:
                self._service.stalled_streams += 1
            logger.warning(
                "dropped a stream whose reader took nothing for %g s", STALLED_STREAM_SECONDS
            )
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def unless_disconnected(raw: Request, work: Coroutine[Any, Any, Any]) -> Any:
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


def add_generation_routes(
    router: APIRouter,
    path: str,
    create: Callable[[Request, str | None], Awaitable[Any]],
    *,
    names: tuple[str, str],
    openapi_extra: dict[str, Any] | None = None,
) -> None:
    """POST `path` and the same under a rollout-scoped base URL (`/rollouts/{rollout_id}` before
    it), both answered by `create(raw, rollout_id)`; `names` are the two routes' (the API
    description's operations)."""

    # No return annotation: FastAPI would describe the answer by it.
    async def plain(raw: Request):
        return await create(raw, None)

    async def in_rollout(rollout_id: str, raw: Request):
        return await create(raw, rollout_id)

    for route_path, endpoint, name in (
        (path, plain, names[0]),
        (f"/rollouts/{{rollout_id}}{path}", in_rollout, names[1]),
    ):
        router.add_api_route(
            route_path, endpoint, methods=["POST"], name=name, openapi_extra=openapi_extra
        )


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The API description of a JSON body a route reads itself and validates with `model`."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline_json_schema(model)}},
        }
    }


def body_description(model: type[BaseModel]) -> dict[str, Any]:
    """The API description of a generation route that reads its body itself: the JSON body it
    validates with `model`, and its answer streamed as server-sent events when asked."""
    return {
        **request_body(model),
        "responses": {"200": {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
    }


def _inline_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its `$defs` written in place: a request body for an
    OpenAPI operation that needs no entry under `components` (the schemas here do not recurse)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref")
            if isinstance(reference, str) and reference.startswith("#/$defs/"):
                found = definitions[reference.removeprefix("#/$defs/")]
                return inline({**found, **{k: v for k, v in node.items() if k != "$ref"}})
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)
