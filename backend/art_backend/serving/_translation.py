"""The translation of other APIs onto chat completions (Responses, Messages): the chat request
each one builds, and the chat stream each reads back and writes again as its own events."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Protocol

from pydantic import ValidationError

from art_backend._errors import BackendError, InvalidRequestError
from art_backend.serving.chat._schemas import ChatCompletionRequest


class EventWriter(Protocol):
    """What writes a chat stream again as another API's events (one per API, in its `_output`)."""

    def chunk(self, chunk: dict[str, Any]) -> Iterable[str]: ...

    def failed(self, message: str) -> str: ...


def translated_request(
    body: dict[str, Any], body_bytes: int, *, param: str
) -> ChatCompletionRequest:
    """The chat request another API's request was translated into (Responses, Messages): its
    fields that are None dropped, checked by the chat schema; a failure (which the other API's
    own schema should have caught) is a 400 naming `param`."""
    try:
        return ChatCompletionRequest.model_validate(
            {key: value for key, value in body.items() if value is not None}
        ).came_in(body_bytes)
    except ValidationError as error:
        first = error.errors()[0]
        raise InvalidRequestError(
            f"The request cannot be served: {first.get('msg')} (at {first.get('loc')}).",
            param=param,
        ) from error


@contextlib.contextmanager
def in_caller_terms(params: dict[str, str], words: dict[str, str]) -> Iterator[None]:
    """Errors from the chat layer name the fields the caller actually sent: the field an error
    names is renamed by `params`, each chat name in its message by `words` (in that order)."""
    try:
        yield
    except BackendError as error:
        error.param = params.get(error.param or "", error.param)
        for chat_name, caller_name in words.items():
            error.message = error.message.replace(chat_name, caller_name)
        error.args = (error.message,)
        raise


async def chat_chunks(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """A chat stream's `data:` lines as chunk dicts, until `[DONE]` (what the translations of
    the other APIs, Responses and Messages, read)."""
    async for line in lines:
        payload = line.removeprefix("data: ").strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


async def translated_events(
    lines: AsyncIterator[str],
    writer: EventWriter,
    finish: Callable[[], Awaitable[Iterable[str]]],
) -> AsyncIterator[str]:
    """A chat stream written again by `writer`, then the last events `finish` gives; a failed
    generation ends it with the writer's failure event instead."""
    try:
        async for chunk in chat_chunks(lines):
            if "error" in chunk:
                yield writer.failed(chunk["error"].get("message", "generation failed"))
                return
            for event in writer.chunk(chunk):
                yield event
        for event in await finish():
            yield event
    finally:
        # Closing the chat stream cancels the generation when the client went away.
        close = getattr(lines, "aclose", None)
        if close is not None:
            await close()
