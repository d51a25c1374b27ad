"""Chat results written back in Anthropic's Messages shape: the Message, its events, its errors.

`MessagesService` (in `_messages.py`) runs a chat completion; this module turns its body into a
Message (`message_object`), or its stream of chunks into Anthropic's events (`EventWriter`):
`message_start`, then per content block `content_block_start`, `content_block_delta`...,
`content_block_stop`, then `message_delta` (the stop reason and the output tokens) and
`message_stop`. Beside Anthropic's fields every Message carries `completion_id` (the id of its
exact-token record), `prompt_token_ids` and `token_ids`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

from fastapi.responses import JSONResponse

from art_backend.serving._sse import sse_json

# Our HTTP status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """Anthropic's error shape; `param` and `code` ride along so an OpenAI reader finds them."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    error = {"type": kind, "message": message, "param": param, "code": code}
    return {"type": "error", "error": error}


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> JSONResponse:
    """An error answer in Anthropic's shape."""
    return JSONResponse(error_body(status, message, param=param, code=code), status_code=status)


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message as content blocks: its text (also when empty, unless it calls tools),
    then one `tool_use` block per call."""
    blocks: list[dict[str, Any]] = []
    calls = message.get("tool_calls") or []
    text = message.get("content")
    if text or not calls:
        blocks.append({"type": "text", "text": text or ""})
    blocks += [tool_use_block(call) for call in calls]
    return blocks


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    """A chat tool call as a `tool_use` block; its `id` is the chat call id, so the record and
    the next turn name the same call."""
    arguments = json.loads(call["function"]["arguments"])
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": call["function"]["name"],
        "input": arguments if isinstance(arguments, dict) else {},
    }


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    """Anthropic's stop reason for a chat finish reason."""
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def message_usage(prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Usage in Anthropic's names (no prompt cache here: its counts are 0)."""
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_object(
    *,
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    stop_sequence: str | None,
    usage: dict[str, Any],
    completion_id: str | None,
    prompt_token_ids: list[int],
    token_ids: list[int],
) -> dict[str, Any]:
    """The Message object, with the exact tokens beside Anthropic's fields."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
        # Beyond Anthropic's fields: where training finds the exact tokens of this answer.
        "completion_id": completion_id,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }


class EventWriter:
    """Turns chat completion chunks into Anthropic's stream events."""

    def __init__(self, model: str) -> None:
        self.message_id = new_id("msg")
        self.model = model
        self.completion_id: str | None = None
        self.prompt_token_ids: list[int] = []
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.blocks = 0  # content blocks opened so far
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self._text_open = False

    @staticmethod
    def event(kind: str, **fields: Any) -> str:
        """One SSE event of this kind."""
        return f"event: {kind}\ndata: {sse_json({'type': kind, **fields})}\n\n"

    def chunk(self, chunk: dict[str, Any]) -> Iterator[str]:
        """The events one chat chunk makes (the first one starts the message)."""
        if self.completion_id is None:
            self.completion_id = chunk["id"]
            self.model = chunk.get("model", self.model)
            self.prompt_token_ids = chunk.get("prompt_token_ids", [])
            start = message_object(
                message_id=self.message_id,
                model=self.model,
                content=[],
                stop_reason=None,
                stop_sequence=None,
                usage=message_usage(len(self.prompt_token_ids), 0),
                completion_id=self.completion_id,
                prompt_token_ids=self.prompt_token_ids,
                token_ids=[],
            )
            yield self.event("message_start", message=start)
        for choice in chunk.get("choices", []):
            self.token_ids += choice.get("token_ids") or []
            delta = choice.get("delta") or {}
            if delta.get("content"):
                yield from self._text(delta["content"])
            if delta.get("tool_calls"):
                yield from self._close_text()
                calls = [
                    {key: value for key, value in call.items() if key != "index"}
                    for call in delta["tool_calls"]
                ]
                self.message["tool_calls"] = calls
                for call in calls:
                    yield from self._tool_use(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                if self.blocks == 0:
                    yield from self._text("")  # an empty answer is still a text block
                yield from self._close_text()

    def _text(self, text: str) -> Iterator[str]:
        if not self._text_open:
            self._text_open = True
            self.message["content"] = ""
            yield self.event(
                "content_block_start",
                index=self.blocks,
                content_block={"type": "text", "text": ""},
            )
        self.message["content"] += text
        if text:
            yield self.event(
                "content_block_delta",
                index=self.blocks,
                delta={"type": "text_delta", "text": text},
            )

    def _close_text(self) -> Iterator[str]:
        if self._text_open:
            self._text_open = False
            yield self.event("content_block_stop", index=self.blocks)
            self.blocks += 1

    def _tool_use(self, call: dict[str, Any]) -> Iterator[str]:
        block = tool_use_block(call)
        yield self.event(
            "content_block_start", index=self.blocks, content_block={**block, "input": {}}
        )
        yield self.event(
            "content_block_delta",
            index=self.blocks,
            delta={"type": "input_json_delta", "partial_json": call["function"]["arguments"]},
        )
        yield self.event("content_block_stop", index=self.blocks)
        self.blocks += 1

    def finish(self, stop_sequence: str | None) -> Iterator[str]:
        """The closing events: the stop reason and output tokens, then `message_stop`."""
        delta = {
            "stop_reason": stop_reason(self.finish_reason, stop_sequence),
            "stop_sequence": stop_sequence,
        }
        usage = message_usage(len(self.prompt_token_ids), len(self.token_ids))
        # `token_ids` beyond Anthropic's fields: the whole answer's exact tokens.
        yield self.event("message_delta", delta=delta, usage=usage, token_ids=self.token_ids)
        yield self.event("message_stop")

    def failed(self, message: str) -> str:
        """The `error` event for a generation the engine could not finish."""
        body = error_body(500, f"Generation failed: {message}")
        return f"event: error\ndata: {sse_json(body)}\n\n"


def new_id(prefix: str) -> str:
    """A fresh id in Anthropic's style: `msg_...`."""
    return f"{prefix}_{secrets.token_hex(12)}"
