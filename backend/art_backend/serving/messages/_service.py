"""Anthropic's Messages API (POST /v1/messages) as a translation over chat completions.

A Messages request becomes a `ChatCompletionRequest` (`system` -> a system message, `tool_use`
blocks -> the assistant turn's tool calls, `tool_result` blocks -> tool messages, tools'
`input_schema` -> function `parameters`, `tool_choice` any/tool -> required/a named function)
and runs through `ChatService` unchanged: both engines, tool-call parsing, constrained decoding
and the exact-token records work as for chat completions, so a rollout of Messages calls
trains like any other. The chat result is written back as a Message, or, streaming, the chat
chunks as Anthropic's events; errors take Anthropic's shape (`_output.error_body`).

The Anthropic SDKs append `/v1/messages` to their base URL: give them the server's root, or
`/rollouts/{id}` for a rollout (`r.base_url.removesuffix("/v1")` in a `model.rollout()` scope).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from art_backend._errors import BackendError, reported_error
from art_backend.serving._request import parse_request
from art_backend.serving._translation import (
    in_caller_terms,
    translated_events,
    translated_request,
)
from art_backend.serving.chat._schemas import ChatCompletionRequest
from art_backend.serving.chat._service import ChatService
from art_backend.serving.messages._output import (
    EventWriter,
    content_blocks,
    error_response,
    message_object,
    message_usage,
    new_id,
    stop_reason,
)
from art_backend.serving.messages._schemas import (
    CountTokensRequest,
    InputMessage,
    MessageCreateRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

# Chat names in errors raised below the translation, and the Messages names a caller sent.
_MESSAGES_TERMS = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences"}
_MESSAGES_WORDS = {"max_completion_tokens": "max_tokens"}  # "stop" is a plain word in messages
OPENAI_STOP_LIMIT = 4  # the chat schema's bound; Anthropic allows more, set after validation

logger = logging.getLogger("art_backend.messages")


class MessagesService:
    """Serves Anthropic's Messages API on top of one `ChatService`."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat

    @staticmethod
    def parse(body: bytes) -> MessageCreateRequest:
        """Validate a request body (a 400 naming the field when it is wrong)."""
        return parse_request(MessageCreateRequest, body)

    async def create(self, request: MessageCreateRequest, rollout_id: str | None) -> dict:
        """Run a non-streaming request to the end and return the Message object."""
        chat_request = chat_request_for(request, stream=False)
        with in_caller_terms(_MESSAGES_TERMS, _MESSAGES_WORDS):
            chat_body = await self.chat.complete(chat_request, rollout_id)
        choice = chat_body["choices"][0]
        stop_sequence = self._stop_sequence(request, choice["finish_reason"], choice["token_ids"])
        usage = chat_body["usage"]
        return message_object(
            message_id=new_id("msg"),
            model=chat_body["model"],
            content=content_blocks(choice["message"]),
            stop_reason=stop_reason(choice["finish_reason"], stop_sequence),
            stop_sequence=stop_sequence,
            usage=message_usage(usage["prompt_tokens"], usage["completion_tokens"]),
            completion_id=chat_body["id"],
            prompt_token_ids=chat_body["prompt_token_ids"],
            token_ids=choice["token_ids"],
        )

    async def stream(
        self, request: MessageCreateRequest, rollout_id: str | None
    ) -> AsyncIterator[str]:
        """Prepare eagerly (so bad input fails before streaming), then yield Anthropic events."""
        chat_request = chat_request_for(request, stream=True)
        with in_caller_terms(_MESSAGES_TERMS, _MESSAGES_WORDS):
            lines = await self.chat.stream(chat_request, rollout_id)
        return self._events(request, lines)

    @staticmethod
    def parse_count(body: bytes) -> CountTokensRequest:
        """Validate a count_tokens body: a Messages request that may leave out `max_tokens`."""
        return parse_request(CountTokensRequest, body)

    async def count_tokens(self, request: CountTokensRequest) -> dict[str, int]:
        """POST /v1/messages/count_tokens: the prompt's length as the model's template renders it."""
        chat_request = chat_request_for(request, stream=False)
        with in_caller_terms(_MESSAGES_TERMS, _MESSAGES_WORDS):
            generation, _, _ = await asyncio.to_thread(self.chat.prepare, chat_request)
        return {"input_tokens": len(generation.prompt_ids)}

    def _events(
        self, request: MessageCreateRequest, lines: AsyncIterator[str]
    ) -> AsyncIterator[str]:
        writer = EventWriter(request.model)

        async def finish() -> list[str]:
            stop_sequence = self._stop_sequence(request, writer.finish_reason, writer.token_ids)
            return list(writer.finish(stop_sequence))

        return translated_events(lines, writer, finish)

    def _stop_sequence(
        self, request: MessageCreateRequest, finish_reason: str | None, token_ids: list[int]
    ) -> str | None:
        """The stop sequence that ended the answer, if one did: the engine stops on it and
        leaves it out of the text, so it is found in the decoded sampled tokens."""
        if finish_reason != "stop" or not request.stop_sequences:
            return None
        sampled = self.chat.engine.tokenizer.decode(token_ids, skip_special_tokens=True)
        found = [(sampled.find(s), s) for s in request.stop_sequences if s in sampled]
        return min(found)[1] if found else None


# ------------------------------------------------------------------------------- translation


def chat_request_for(request: MessageCreateRequest, *, stream: bool) -> ChatCompletionRequest:
    """The chat completion request a Messages request means."""
    system = [{"role": "system", "content": request.system_text}] if request.system_text else []
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
                "strict": tool.strict,
            },
        }
        for tool in request.tools or []
    ]
    choice = request.tool_choice
    tool_choice: Any = None
    if choice is not None and tools:
        tool_choice = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type)
        if choice.type == "tool":
            tool_choice = {"type": "function", "function": {"name": choice.name}}
    stops = request.stop_sequences or []
    body = {
        "model": request.model,
        "messages": [*system, *chat_messages(request.messages)],
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "stop": stops[:OPENAI_STOP_LIMIT] or None,
        "tools": tools or None,
        "tool_choice": tool_choice,
        "parallel_tool_calls": not (choice is not None and choice.disable_parallel_tool_use),
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    chat = translated_request(body, request.body_bytes, param="messages")
    chat.stop = stops or None  # Anthropic allows more stop sequences than OpenAI's four
    return chat


def chat_messages(messages: list[InputMessage]) -> list[dict[str, Any]]:
    """Anthropic turns as chat messages: an assistant turn's `tool_use` blocks become its tool
    calls (arguments written as the chat layer writes them, so the next turn extends the
    recorded one), a user turn's `tool_result` blocks become tool messages before its text."""
    chat: list[dict[str, Any]] = []
    for message in messages:
        texts = [block.text for block in message.content if isinstance(block, TextBlock)]
        if message.role == "assistant":
            calls = [_tool_call(b) for b in message.content if isinstance(b, ToolUseBlock)]
            turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                turn["tool_calls"] = calls
            elif turn["content"] is None:
                turn["content"] = ""
            chat.append(turn)
            continue
        chat += [
            {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text}
            for block in message.content
            if isinstance(block, ToolResultBlock)
        ]
        if texts or not any(isinstance(block, ToolResultBlock) for block in message.content):
            chat.append({"role": message.role, "content": "\n".join(texts)})
    return chat


def _tool_call(block: ToolUseBlock) -> dict[str, Any]:
    return {
        "id": block.id,
        "type": "function",
        "function": {
            "name": block.name,
            "arguments": json.dumps(block.input, ensure_ascii=False),
        },
    }


async def in_anthropic_shape(work: Awaitable[Any]) -> Any:
    """Await a Messages route's work; an error it raises is answered in Anthropic's shape
    (the app's handlers answer OpenAI's, which an Anthropic SDK cannot read)."""
    try:
        return await work
    except BackendError as error:
        return error_response(error.status_code, error.message, param=error.param, code=error.code)
    except ValidationError as error:
        return _validation_error(error)
    except HTTPException:
        raise  # the app's own answers (a body over --max-body-mb: 413), not bugs
    except Exception as error:  # a bug: logged as the app logs one, answered as the SDK reads
        logger.exception("unexpected error")
        return error_response(500, f"Internal error: {type(error).__name__}: {error}")


def _validation_error(error: ValidationError) -> Response:
    first, param = reported_error(error.errors())
    if first.get("type") == "extra_forbidden":
        message = f"{param}: Extra inputs are not permitted (not a Messages API field here)"
    else:
        reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        message = f"{param}: {reason}" if param else reason
    return error_response(400, message, param=param, code="invalid_value")
