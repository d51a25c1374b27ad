"""What the translations of other APIs over the chat service share (Responses, Messages): the
chat request they build, and the chat stream they read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from art_backend._errors import InvalidRequestError
from art_backend.serving._schemas import ChatCompletionRequest


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


async def chat_chunks(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """A chat stream's `data:` lines as chunk dicts, until `[DONE]` (what the translations of
    the other APIs, Responses and Messages, read)."""
    async for line in lines:
        payload = line.removeprefix("data: ").strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)
