"""LangChain's ChatOpenAI against the server: invoke, tools, structured output and streaming."""

from __future__ import annotations

from typing import Literal

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.support.servers import RunningServer

QUESTION = "What is the capital of France?"


class Weather(BaseModel):
    """Weather in a city."""

    city: Literal["Paris", "Rome"]


class Answer(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    rank: int = Field(ge=1, le=5)


@pytest.fixture
def chat(server: RunningServer) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{server.url}/v1",
        api_key="x",
        model="tiny",
        max_retries=0,
        max_tokens=60,
    )


def test_invoke_returns_an_ai_message_with_usage(chat: ChatOpenAI):
    message = chat.invoke(QUESTION)

    assert isinstance(message, AIMessage)
    assert isinstance(message.content, str)
    usage = message.usage_metadata
    assert usage["output_tokens"] >= 1
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_a_bound_tool_forced_by_name_comes_back_as_a_tool_call(chat: ChatOpenAI):
    # strict adds `additionalProperties: false`; without it the random model may invent keys.
    message = chat.bind_tools([Weather], tool_choice="Weather", strict=True).invoke(QUESTION)

    assert [call["name"] for call in message.tool_calls] == ["Weather"]
    arguments = message.tool_calls[0]["args"]
    assert isinstance(arguments, dict)
    assert Weather.model_validate(arguments).city in {"Paris", "Rome"}


def test_structured_output_with_a_json_schema_returns_the_model(chat: ChatOpenAI):
    answer = chat.with_structured_output(Answer, method="json_schema").invoke(QUESTION)

    assert isinstance(answer, Answer)


def test_stream_yields_chunks_that_concatenate_to_text(chat: ChatOpenAI):
    chunks = list(chat.stream(QUESTION))

    assert chunks and all(isinstance(chunk, AIMessageChunk) for chunk in chunks)
    assert isinstance("".join(chunk.content for chunk in chunks), str)


async def test_ainvoke_returns_an_ai_message(chat: ChatOpenAI):
    message = await chat.ainvoke(QUESTION)

    assert isinstance(message, AIMessage)
    assert isinstance(message.content, str)
