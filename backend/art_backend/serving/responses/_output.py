"""Chat results written back in the Responses API's shape: the Response object and its events.

`ResponsesService` (in `_responses.py`) runs a chat completion; this module turns its body into
a Response (`response_object`, `output_items`), or its stream of chunks into the Responses
events, numbered by `sequence_number` (`EventWriter`). Beside OpenAI's fields every Response
carries `completion_id` (the id of its exact-token record), `prompt_token_ids` and `token_ids`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

from art_backend.serving._sse import sse_json
from art_backend.serving.responses._schemas import ResponseCreateRequest, ToolChoiceFunction


class EventWriter:
    """Turns chat completion chunks into Responses events, numbering them in order."""

    def __init__(self, request: ResponseCreateRequest) -> None:
        self.request = request
        self.response_id = new_id("resp")
        self.created_at = int(time.time())
        self.sequence = 0
        self.model = request.model
        self.completion_id: str | None = None
        self.prompt_token_ids: list[int] = []
        self.token_ids: list[int] = []
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.output: list[dict[str, Any]] = []
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self._text_item: dict[str, Any] | None = None  # the message item being streamed
        self._logprobs: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> str:
        """One SSE event of this kind, with the next sequence number."""
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {sse_json(body)}\n\n"

    def snapshot(self, status: str) -> dict[str, Any]:
        """The Response as it stands before any output (for created, in_progress, failed)."""
        return response_object(
            self.request,
            response_id=self.response_id,
            created_at=self.created_at,
            model=self.model,
            status=status,
            output=[],
            usage=None,
            completion_id=self.completion_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=[],
        )

    def chunk(self, chunk: dict[str, Any]) -> Iterator[str]:
        """The events one chat chunk makes (the first one opens the response)."""
        if self.completion_id is None:
            self.completion_id = chunk["id"]
            self.model = chunk.get("model", self.model)
            self.prompt_token_ids = chunk.get("prompt_token_ids", [])
            yield self.event("response.created", response=self.snapshot("in_progress"))
            yield self.event("response.in_progress", response=self.snapshot("in_progress"))
        if chunk.get("usage"):
            self.usage = response_usage(chunk["usage"])
        for choice in chunk.get("choices", []):
            self.token_ids += choice.get("token_ids") or []
            delta = choice.get("delta") or {}
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            if delta.get("content") or (logprobs and self._text_item is not None):
                yield from self._text(delta.get("content") or "", logprobs)
            elif logprobs:
                self._logprobs += logprobs  # tool output streams no text, only at the end
            if delta.get("tool_calls"):
                yield from self._close_text()
                calls = delta["tool_calls"]
                self.message["tool_calls"] = [
                    {key: value for key, value in call.items() if key != "index"} for call in calls
                ]
                for call in calls:
                    yield from self._function_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                if self._text_item is None and not self.message.get("tool_calls"):
                    yield from self._text("", [])  # an empty answer is still a message
                yield from self._close_text()

    def _text(self, delta: str, logprobs: list[dict[str, Any]]) -> Iterator[str]:
        if self._text_item is None:
            self._text_item = {
                "id": new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.message["content"] = ""
            index = len(self.output)
            yield self.event("response.output_item.added", output_index=index, item=self._text_item)
            yield self.event(
                "response.content_part.added",
                item_id=self._text_item["id"],
                output_index=index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
        self.message["content"] += delta
        self._logprobs += logprobs
        yield self.event(
            "response.output_text.delta",
            item_id=self._text_item["id"],
            output_index=len(self.output),
            content_index=0,
            delta=delta,
            logprobs=logprobs,
        )

    def _close_text(self) -> Iterator[str]:
        if self._text_item is None:
            return
        item, index, text = self._text_item, len(self.output), self.message["content"]
        logprobs = self._logprobs
        part = text_part(text, logprobs)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        yield self.event("response.output_text.done", **where, text=text, logprobs=logprobs)
        yield self.event("response.content_part.done", **where, part=part)
        done = {**item, "status": response_status(self.finish_reason), "content": [part]}
        yield self.event("response.output_item.done", output_index=index, item=done)
        self.output.append(done)
        self._text_item = None

    def _function_call(self, call: dict[str, Any]) -> Iterator[str]:
        item = function_call_item(call)
        index = len(self.output)
        yield self.event(
            "response.output_item.added",
            output_index=index,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        for kind, field in (("delta", "delta"), ("done", "arguments")):
            yield self.event(
                f"response.function_call_arguments.{kind}",
                item_id=item["id"],
                output_index=index,
                **{field: item["arguments"]},
            )
        yield self.event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def body(self) -> dict[str, Any]:
        """The finished Response object, as a non-streaming request returns it."""
        return response_object(
            self.request,
            response_id=self.response_id,
            created_at=self.created_at,
            model=self.model,
            status=response_status(self.finish_reason or "stop"),
            output=self.output,
            usage=self.usage,
            completion_id=self.completion_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=self.token_ids,
        )

    def finish(self, body: dict[str, Any]) -> str:
        """The closing event: `response.completed`, or `response.incomplete` when cut off."""
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return self.event(kind, response=body)

    def failed(self, message: str) -> str:
        """The `response.failed` event for a generation the engine could not finish."""
        body = {
            **self.snapshot("failed"),
            "error": {"code": "server_error", "message": f"Generation failed: {message}"},
        }
        return self.event("response.failed", response=body)


def output_items(
    message: dict[str, Any], finish_reason: str, logprobs: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """A chat message as output items: its text as a message item, then one per tool call."""
    items: list[dict[str, Any]] = []
    calls = message.get("tool_calls") or []
    content = message.get("content")
    if content or (content is not None and not calls):
        entries = (logprobs or {}).get("content") or []
        items.append(
            {
                "id": new_id("msg"),
                "type": "message",
                "status": response_status(finish_reason),
                "role": "assistant",
                "content": [text_part(content, entries)],
            }
        )
    items += [function_call_item(call) for call in calls]
    return items


def text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    """An `output_text` part; `logprobs` stay empty unless asked for (`top_logprobs`, or
    `include` "message.output_text.logprobs")."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def function_call_item(call: dict[str, Any]) -> dict[str, Any]:
    """A chat tool call as a `function_call` output item (its `call_id` is the chat call id)."""
    return {
        "id": new_id("fc"),
        "type": "function_call",
        "status": "completed",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
    }


def assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """The answer as the chat message the next turn renders (what the record holds)."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def response_status(finish_reason: str | None) -> str:
    """A response's (and its items') status: cut off by the token budget, or completed."""
    return "incomplete" if finish_reason == "length" else "completed"


def response_usage(chat_usage: dict[str, int]) -> dict[str, Any]:
    """Chat usage in the Responses names (no cache hits or reasoning tokens here)."""
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def response_object(
    request: ResponseCreateRequest,
    *,
    response_id: str,
    created_at: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    completion_id: str | None,
    prompt_token_ids: list[int],
    token_ids: list[int],
) -> dict[str, Any]:
    """The Response object: the request's settings echoed, the output, the exact tokens."""
    tool_choice: Any = request.tool_choice or ("auto" if request.tools else "none")
    if isinstance(tool_choice, ToolChoiceFunction):
        tool_choice = tool_choice.model_dump()
    text_format = request.text.format if request.text and request.text.format else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": request.store,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": {
            "format": (
                text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format
                else {"type": "text"}
            )
        },
        "tool_choice": tool_choice,
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": request.user,
        "metadata": request.metadata or {},
        # Beyond OpenAI's fields: where training finds the exact tokens of this answer.
        "completion_id": completion_id,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }


def new_id(prefix: str) -> str:
    """A fresh id in OpenAI's style: `resp_...`, `msg_...`, `fc_...`."""
    return f"{prefix}_{secrets.token_hex(16)}"
