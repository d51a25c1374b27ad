"""ART's `art.utils.litellm`: a litellm choice as an OpenAI `Choice`, so it can go into a
Trajectory's `messages_and_choices`.

Duck-typed: litellm is not a dependency and is never imported; any object with litellm's (and
OpenAI's) attribute names converts, and so does a dict of them.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_tool_call import (
    ChatCompletionMessageToolCall,
    Function,
)
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob

__all__ = ["convert_litellm_choice_to_openai"]


def _get(value: Any, name: str, default: Any = None) -> Any:
    if isinstance(value, dict):
        return value.get(name, default)
    return getattr(value, name, default)


def convert_litellm_choice_to_openai(litellm_choice: Any) -> Choice:
    """A non-streaming litellm choice (`response.choices[i]`) as an OpenAI `Choice`: the assistant
    message, its function tool calls and its token logprobs. A streaming delta raises ValueError."""
    message = _get(litellm_choice, "message")
    if message is None:
        raise ValueError(
            "Only non-streaming choices convert: this choice has no message (a delta?)."
        )
    role = _get(message, "role")
    if role != "assistant":
        raise ValueError(f"Only assistant messages convert, not role {role!r}.")
    tool_calls = None
    if _get(message, "tool_calls"):
        tool_calls = []
        for call in _get(message, "tool_calls"):
            function = _get(call, "function")
            if _get(call, "type", "function") != "function" or _get(function, "name") is None:
                raise ValueError(f"Only named function tool calls convert: {call!r}")
            tool_calls.append(
                ChatCompletionMessageToolCall(
                    id=_get(call, "id"),
                    type="function",
                    function=Function(
                        name=_get(function, "name"), arguments=_get(function, "arguments") or ""
                    ),
                )
            )
    logprobs = None
    content = _get(_get(litellm_choice, "logprobs"), "content")
    if content is not None:
        logprobs = ChoiceLogprobs(content=[_token_logprob(token) for token in content])
    return Choice(
        message=ChatCompletionMessage(
            content=_get(message, "content"), role="assistant", tool_calls=tool_calls
        ),
        finish_reason=_get(litellm_choice, "finish_reason") or "stop",
        index=_get(litellm_choice, "index", 0),
        logprobs=logprobs,
    )


def _token_logprob(token: Any) -> ChatCompletionTokenLogprob:
    return ChatCompletionTokenLogprob(
        token=_get(token, "token"),
        bytes=_get(token, "bytes"),
        logprob=_get(token, "logprob"),
        top_logprobs=[
            TopLogprob(
                token=_get(top, "token"), logprob=_get(top, "logprob"), bytes=_get(top, "bytes")
            )
            for top in _get(token, "top_logprobs") or []
        ],
    )
