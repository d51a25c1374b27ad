"""The Responses API (POST /v1/responses) as a translation over chat completions.

A Responses request becomes a `ChatCompletionRequest` (instructions -> system message, input
items -> chat messages, flattened function tools -> chat tools, `text.format` ->
`response_format`) and runs through `ChatService` unchanged: both engines, tool-call parsing,
constrained decoding and the exact-token records work as for chat completions. The chat result
is then written back as a Response object, or, streaming, the chat chunks as Responses events.

Training finds a response's tokens as it finds a chat completion's: the record is stored under
its completion id (`completion_id` in the Response, beside `prompt_token_ids` and `token_ids`)
and under the rollout id (the `x-rollout-id` header or a `/rollouts/{id}/v1` base URL).

`previous_response_id`: each stored response (`store`, true by default) keeps its conversation
as chat messages, without its `instructions` (OpenAI does not carry those over either). The
store is bounded like the completion records: at most `max_records` responses, none older than
`ttl_seconds`, oldest dropped first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from art_backend._errors import InvalidRequestError, ResponseNotFoundError
from art_backend.serving._request import parse_request
from art_backend.serving._translation import (
    in_caller_terms,
    translated_events,
    translated_request,
)
from art_backend.serving.chat._schemas import ChatCompletionRequest
from art_backend.serving.chat._service import ChatService
from art_backend.serving.responses._output import (
    EventWriter,
    assistant_message,
    new_id,
    output_items,
    response_object,
    response_status,
    response_usage,
)
from art_backend.serving.responses._schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    ResponseCreateRequest,
    ToolChoiceFunction,
)
from art_backend.store._records import estimated_bytes

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

# Chat names in errors raised below the translation, and the Responses names a caller sent.
_RESPONSES_TERMS = {
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
}
# Those renamed in an error's text: all but "messages", a plain word there ("shorten the messages").
_RESPONSES_WORDS = {k: v for k, v in _RESPONSES_TERMS.items() if k != "messages"}


@dataclass
class _Stored:
    stored_at: float
    body: dict[str, Any]
    conversation: list[dict[str, Any]]
    size: int


class StoredResponses:
    """Thread-safe, bounded store of responses: the body and the conversation it continues.

    Bounded like the completion records: at most `max_records` responses and `max_bytes`
    (estimated), none older than `ttl_seconds`; the oldest go first. A conversation shares the
    messages of the response it continues, so each response is charged only for its new ones.
    """

    def __init__(self, *, max_records: int, ttl_seconds: float, max_bytes: int) -> None:
        self.max_records = max_records
        self.ttl_seconds = ttl_seconds
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[str, _Stored] = OrderedDict()
        self._lock = threading.Lock()

    def add(
        self,
        body: dict[str, Any],
        conversation: list[dict[str, Any]],
        new_messages: list[dict[str, Any]],
    ) -> None:
        """Keep a response and its whole conversation (chat messages, instructions excluded);
        `new_messages`, the part of it this response added, is what its size is counted on."""
        size = estimated_bytes([body, new_messages])  # outside the lock: it walks them all
        now = time.time()
        with self._lock:
            self._entries[body["id"]] = _Stored(now, body, conversation, size)
            self.bytes += size
            while self._entries:
                oldest = next(iter(self._entries.values()))
                if (
                    len(self._entries) <= self.max_records
                    and self.bytes <= self.max_bytes
                    and now - oldest.stored_at <= self.ttl_seconds
                ):
                    break
                self._forget_locked(next(iter(self._entries)))
                self.evictions += 1

    def get(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """(body, conversation) of a stored response, or None when unknown or expired."""
        with self._lock:
            entry = self._entries.get(response_id)
        if entry is None or time.time() - entry.stored_at > self.ttl_seconds:
            return None
        return entry.body, entry.conversation

    def delete(self, response_id: str) -> bool:
        """Forget a response; False when it was not stored."""
        with self._lock:
            return self._forget_locked(response_id)

    def _forget_locked(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size
        return entry is not None

    def __len__(self) -> int:
        return len(self._entries)


class ResponsesService:
    """Serves the Responses API on top of one `ChatService`."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat
        records = chat.records
        self.stored = StoredResponses(
            max_records=records.max_records,
            ttl_seconds=records.ttl_seconds,
            max_bytes=records.max_bytes // 2,  # beside the records, not on top of their budget
        )

    @staticmethod
    def parse(body: bytes) -> ResponseCreateRequest:
        """Validate a request body (a 400 naming the field when it is wrong)."""
        return parse_request(ResponseCreateRequest, body)

    # ------------------------------------------------------------------------------- requests

    async def create(self, request: ResponseCreateRequest, rollout_id: str | None) -> dict:
        """Run a non-streaming request to the end and return the Response object."""
        earlier, new = self._conversation(request)
        chat_request = self._chat_request(request, [*earlier, *new], stream=False)
        started_at = int(time.time())
        with in_caller_terms(_RESPONSES_TERMS, _RESPONSES_WORDS):
            chat_body = await self.chat.complete(chat_request, rollout_id)
        choice = chat_body["choices"][0]
        message = choice["message"]
        body = response_object(
            request,
            response_id=new_id("resp"),
            created_at=started_at,
            model=chat_body["model"],
            status=response_status(choice["finish_reason"]),
            output=output_items(message, choice["finish_reason"], choice.get("logprobs")),
            usage=response_usage(chat_body["usage"]),
            completion_id=chat_body["id"],
            prompt_token_ids=chat_body["prompt_token_ids"],
            token_ids=choice["token_ids"],
        )
        await self._keep(request, body, earlier, [*new, assistant_message(message)])
        return body

    async def stream(
        self, request: ResponseCreateRequest, rollout_id: str | None
    ) -> AsyncIterator[str]:
        """Prepare eagerly (so bad input fails before streaming), then yield Responses events."""
        earlier, new = self._conversation(request)
        chat_request = self._chat_request(request, [*earlier, *new], stream=True)
        with in_caller_terms(_RESPONSES_TERMS, _RESPONSES_WORDS):
            lines = await self.chat.stream(chat_request, rollout_id)
        return self._events(request, earlier, new, lines)

    def get(self, response_id: str) -> dict[str, Any]:
        """The stored Response object; 404 when unknown, stored with store=false, or expired."""
        found = self.stored.get(response_id)
        if found is None:
            raise ResponseNotFoundError(
                f"No response {response_id!r}: it was never served here, was created with "
                "store=false, or expired (responses are kept like completion records).",
                param="response_id",
            )
        return found[0]

    def delete(self, response_id: str) -> dict[str, Any]:
        """Forget a stored response (its completion record stays for training)."""
        self.get(response_id)
        self.stored.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def _keep(
        self,
        request: ResponseCreateRequest,
        body: dict[str, Any],
        earlier: list[dict[str, Any]],
        new: list[dict[str, Any]],
    ) -> None:
        """Store the response for `previous_response_id` and GET, unless `store` is false."""
        if request.store:
            # Sizing walks the new messages: off the event loop, as the records are stored.
            await asyncio.to_thread(self.stored.add, body, [*earlier, *new], new)

    # ---------------------------------------------------------------------------- translation

    def _conversation(
        self, request: ResponseCreateRequest
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(the chat messages this request continues from `previous_response_id`, its input)."""
        earlier: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            found = self.stored.get(request.previous_response_id)
            if found is None:
                raise InvalidRequestError(
                    f"Previous response with id {request.previous_response_id!r} not found: it "
                    "was never served here, was created with store=false, or expired. Send the "
                    "whole conversation in `input` instead, or create it again with store=true.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            earlier = found[1]
        new = _input_messages(request)
        if not earlier and not new:
            raise InvalidRequestError(
                "`input` is empty: send a string or at least one input item.", param="input"
            )
        return earlier, new

    def _chat_request(
        self, request: ResponseCreateRequest, conversation: list[dict[str, Any]], *, stream: bool
    ) -> ChatCompletionRequest:
        instructions = (
            [{"role": "system", "content": request.instructions}] if request.instructions else []
        )
        tools = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters or EMPTY_PARAMETERS,
                    "strict": tool.strict,
                },
            }
            for tool in request.tools or []
        ]
        tool_choice: Any = request.tool_choice
        if isinstance(tool_choice, ToolChoiceFunction):
            tool_choice = {"type": "function", "function": {"name": tool_choice.name}}
        body = {
            "model": request.model,
            "messages": [*instructions, *conversation],
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "max_completion_tokens": request.max_output_tokens,
            "stop": request.stop,
            "seed": request.seed,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "logit_bias": request.logit_bias,
            "tools": tools or None,
            "tool_choice": tool_choice if tools else None,
            "parallel_tool_calls": request.parallel_tool_calls,
            "response_format": _response_format(request),
            "logprobs": request.wants_logprobs,
            "top_logprobs": request.top_logprobs,
            "stream": stream,
            # The usage chunk closes the stream: the Response's usage comes from it.
            "stream_options": {"include_usage": True} if stream else None,
            "metadata": request.metadata,
            "user": request.user,
        }
        return translated_request(body, request.body_bytes, param="input")

    # ------------------------------------------------------------------------------ streaming

    def _events(
        self,
        request: ResponseCreateRequest,
        earlier: list[dict[str, Any]],
        new: list[dict[str, Any]],
        lines: AsyncIterator[str],
    ) -> AsyncIterator[str]:
        writer = EventWriter(request)

        async def finish() -> list[str]:
            body = writer.body()
            # Stored before the last event, so a client that continues it at once finds it.
            await self._keep(request, body, earlier, [*new, assistant_message(writer.message)])
            return [writer.finish(body)]

        return translated_events(lines, writer, finish)


# ---------------------------------------------------------------------------------- helpers


def _input_messages(request: ResponseCreateRequest) -> list[dict[str, Any]]:
    """Input items as chat messages: calls join the assistant turn before them, as sampled."""
    messages: list[dict[str, Any]] = []
    for item in request.input or []:
        if isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
        else:
            messages.append({"role": item.role, "content": item.text})
    return messages


def _response_format(request: ResponseCreateRequest) -> dict[str, Any] | None:
    text_format = request.text.format if request.text else None
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return {"type": "json_object"}
    json_schema: dict[str, Any] = {"name": text_format.name, "schema": text_format.schema_}
    if text_format.strict is not None:
        json_schema["strict"] = text_format.strict
    if text_format.description is not None:
        json_schema["description"] = text_format.description
    return {"type": "json_schema", "json_schema": json_schema}
