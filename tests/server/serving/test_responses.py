"""POST /v1/responses through the real openai SDK and the OpenAI Agents SDK.

The Responses API is a translation over chat completions, so these tests pin the translation:
the prompt a Responses request renders is the prompt of the equivalent chat request, the answer
carries the exact token ids, and the record under the rollout id is the one training reads.
The tiny model is random: tool calls and JSON are forced with tool_choice and text.format.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

import art_core as art
from art_backend.serving.responses._service import StoredResponses
from art_backend.store._records import estimated_bytes
from tests.support.chat_messages import ADD_TOOL as CHAT_ADD_TOOL
from tests.support.servers import RunningServer

QUESTION = "What is the capital of France?"
# Greedy and deterministic; the penalty stops the random model repeating one token.
VARIED_GREEDY = {"temperature": 0.0, "extra_body": {"frequency_penalty": 2.0}}
# The same tool in the Responses shape: flattened, and strict so its arguments are enforced.
ADD_TOOL = {"type": "function", **CHAT_ADD_TOOL["function"], "strict": True}
# One forced call, then the end: with parallel calls allowed the random model may chain them.
ONE_FORCED_CALL = {"tools": [ADD_TOOL], "tool_choice": "required", "parallel_tool_calls": False}
# A bounded tool argument: unbounded, greedy decoding writes digits until the token budget ends.
Digit = Annotated[int, Field(ge=0, le=9)]
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def rollout_client(server: RunningServer, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=0
    )


def rollout_records(server: RunningServer, rollout_id: str) -> list[dict]:
    response = httpx.get(f"{server.url}/v1/rollouts/{rollout_id}", headers=server.headers())
    assert response.status_code == 200
    return response.json()["completions"]


def chat_prompt_ids(client: openai.OpenAI, messages: list[dict], **fields) -> list[int]:
    """The prompt token ids the chat API renders for these messages (the reference)."""
    response = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=1, **fields
    )
    return response.model_extra["prompt_token_ids"]


def assert_add_arguments(arguments: str) -> None:
    values = json.loads(arguments)
    assert set(values) == {"a", "b"}
    assert all(isinstance(v, int) and 0 <= v <= 9 for v in values.values())


# -------------------------------------------------------------------------------- plain answers


def test_string_input_answers_with_a_message_and_its_exact_tokens(client, tokenizer):
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=12)

    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in {"completed", "incomplete"}
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    token_ids = response.model_extra["token_ids"]
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == response.output_text
    prompt_ids = response.model_extra["prompt_token_ids"]
    assert prompt_ids == chat_prompt_ids(client, [{"role": "user", "content": QUESTION}])
    assert response.usage.input_tokens == len(prompt_ids)
    assert response.usage.output_tokens == len(token_ids)
    assert response.usage.total_tokens == len(prompt_ids) + len(token_ids)


def test_instructions_are_the_system_message(client):
    response = client.responses.create(
        model="tiny", instructions="Answer in French.", input=QUESTION, max_output_tokens=2
    )
    expected = chat_prompt_ids(
        client,
        [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": QUESTION}],
    )
    assert response.model_extra["prompt_token_ids"] == expected
    assert response.instructions == "Answer in French."


def test_greedy_answer_equals_the_chat_completion_of_the_same_messages(client):
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    response = client.responses.create(
        model="tiny",
        input=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_output_tokens=16,
        **VARIED_GREEDY,
    )
    chat = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=16, temperature=0.0, frequency_penalty=2.0
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.model_extra["token_ids"] == chat.choices[0].model_extra["token_ids"]


def test_max_output_tokens_cuts_the_answer_as_incomplete(client, tokenizer):
    response = client.responses.create(
        model="tiny",
        input=QUESTION,
        max_output_tokens=3,
        extra_body={"logit_bias": {str(tokenizer.eos_token_id): -100}},
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


# ------------------------------------------------------------------------------ function tools


def test_required_tool_choice_gives_a_function_call_and_the_output_turn_continues(client):
    first = client.responses.create(
        model="tiny", input=QUESTION, max_output_tokens=60, temperature=0.0, **ONE_FORCED_CALL
    )
    [call] = first.output
    assert call.type == "function_call" and call.name == "add"
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert_add_arguments(call.arguments)

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "7"}
    second = client.responses.create(
        model="tiny",
        input=[{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True), result],
        tools=[ADD_TOOL],
        max_output_tokens=4,
    )
    # The second prompt is the chat conversation: user, the call, the tool's answer.
    expected = chat_prompt_ids(
        client,
        [
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": "add", "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "7"},
        ],
        tools=[
            {"type": "function", "function": {k: v for k, v in ADD_TOOL.items() if k != "type"}}
        ],
    )
    assert second.model_extra["prompt_token_ids"] == expected


def test_a_named_tool_choice_forces_that_function(client):
    response = client.responses.create(
        model="tiny",
        input=QUESTION,
        tools=[ADD_TOOL, {**ADD_TOOL, "name": "subtract", "description": "Subtract."}],
        tool_choice={"type": "function", "name": "subtract"},
        parallel_tool_calls=False,
        max_output_tokens=60,
        temperature=0.0,
    )
    assert [item.name for item in response.output] == ["subtract"]


# ---------------------------------------------------------------------- previous_response_id


def test_previous_response_id_continues_the_stored_conversation_without_its_instructions(
    client,
):
    first = client.responses.create(
        model="tiny", instructions="Old rules.", input="Hi", max_output_tokens=5
    )
    second = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        instructions="New rules.",
        input="And then?",
        max_output_tokens=2,
    )
    expected = chat_prompt_ids(
        client,
        [
            {"role": "system", "content": "New rules."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And then?"},
        ],
    )
    assert second.model_extra["prompt_token_ids"] == expected
    assert second.previous_response_id == first.id


def test_a_response_created_with_store_false_cannot_be_continued(client):
    unstored = client.responses.create(model="tiny", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model="tiny", previous_response_id=unstored.id, input="More", max_output_tokens=2
        )
    assert raised.value.code == "previous_response_not_found"
    assert "store=false" in raised.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_stored_response_is_retrieved_and_deleted(client):
    created = client.responses.create(model="tiny", input="Hi", max_output_tokens=3)
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


# ------------------------------------------------------------------------------------ streaming


def test_streamed_events_come_in_order_and_spell_the_non_streamed_answer(client):
    request = {"model": "tiny", "input": QUESTION, "max_output_tokens": 16, **VARIED_GREEDY}
    whole = client.responses.create(**request)
    events = list(client.responses.create(**request, stream=True))

    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    deltas = kinds[4:-4]
    assert deltas and set(deltas) == {"response.output_text.delta"}
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        whole.output_text
    )
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.model_extra["token_ids"] == whole.model_extra["token_ids"]
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert len({events[0].response.id, final.id}) == 1


def test_the_sdk_stream_helper_gives_the_final_response(client):
    # The helper wants `response.completed`: an enum answer ends before the token budget.
    request = {
        "model": "tiny",
        "input": QUESTION,
        "max_output_tokens": 40,
        "text": {"format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA}},
    }
    whole = client.responses.create(**request, temperature=0.0)
    with client.responses.stream(**request, temperature=0.0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert whole.status == final.status == "completed"
    assert text == final.output_text == whole.output_text
    assert json.loads(text)["city"] in {"Paris", "Rome", "Berlin"}


def test_a_streamed_function_call_sends_its_arguments_and_the_final_item(client):
    events = list(
        client.responses.create(
            model="tiny",
            input=QUESTION,
            max_output_tokens=60,
            temperature=0.0,
            stream=True,
            **ONE_FORCED_CALL,
        )
    )
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[4]
    assert_add_arguments(done.arguments)
    [item] = events[-1].response.output
    assert item.type == "function_call" and item.arguments == done.arguments


def test_a_previous_response_id_works_from_a_streamed_response(client):
    events = list(
        client.responses.create(model="tiny", input="Hi", max_output_tokens=4, stream=True)
    )
    first = events[-1].response
    second = client.responses.create(
        model="tiny", previous_response_id=first.id, input="More", max_output_tokens=2
    )
    expected = chat_prompt_ids(
        client,
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "More"},
        ],
    )
    assert second.model_extra["prompt_token_ids"] == expected


# ---------------------------------------------------------------------------- structured output


def test_text_format_json_schema_is_enforced(client):
    schema = {
        **CITY_SCHEMA,
        "properties": {
            **CITY_SCHEMA["properties"],
            "rank": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["city", "rank"],
    }
    response = client.responses.create(
        model="tiny",
        input=QUESTION,
        max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
    )
    answer = json.loads(response.output_text)
    assert set(answer) == {"city", "rank"} and answer["city"] in {"Paris", "Rome", "Berlin"}
    assert 1 <= answer["rank"] <= 5
    assert response.text.format.type == "json_schema"


class Capital(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    rank: Literal[1, 2, 3]


def test_the_sdk_parse_helper_gets_a_parsed_pydantic_object(client):
    response = client.responses.parse(
        model="tiny", input=QUESTION, text_format=Capital, max_output_tokens=60
    )
    assert isinstance(response.output_parsed, Capital)
    assert response.output_parsed == Capital.model_validate_json(response.output_text)


# -------------------------------------------------------------------------- records for training


def test_records_under_the_rollout_hold_the_exact_tokens_of_each_response(server):
    rollout_id = f"responses-{uuid.uuid4().hex[:8]}"
    client = rollout_client(server, rollout_id)
    plain = client.responses.create(model="tiny", input="Hi", max_output_tokens=5)
    streamed = list(
        client.responses.create(model="tiny", input="Yo", max_output_tokens=5, stream=True)
    )
    headed = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    by_header = headed.responses.create(
        model="tiny",
        input="Hey",
        max_output_tokens=5,
        extra_headers={"x-rollout-id": rollout_id},
    )

    answers = [plain, streamed[-1].response, by_header]
    records = rollout_records(server, rollout_id)
    assert [r["id"] for r in records] == [a.model_extra["completion_id"] for a in answers]
    for record, answer in zip(records, answers, strict=True):
        assert record["prompt_token_ids"] == answer.model_extra["prompt_token_ids"]
        assert record["choices"][0]["token_ids"] == answer.model_extra["token_ids"]
        assert len(record["choices"][0]["logprobs"]) == len(answer.model_extra["token_ids"])
        assert record["rollout_id"] == rollout_id


def test_logprobs_are_returned_when_included(client):
    response = client.responses.create(
        model="tiny", input="Hi", max_output_tokens=4, top_logprobs=2
    )
    [part] = response.output[0].content
    assert len(part.logprobs) == response.usage.output_tokens
    assert all(len(entry.top_logprobs) == 2 for entry in part.logprobs)


# ------------------------------------------------------------------------- the bounded store


def stored_body(number: int) -> dict:
    return {"id": f"resp_{number}", "output": [], "token_ids": list(range(50))}


def test_the_store_drops_the_oldest_responses_past_its_count():
    store = StoredResponses(max_records=2, ttl_seconds=3600, max_bytes=10**9)
    for number in range(3):
        store.add(stored_body(number), [], [])
    assert store.get("resp_0") is None and store.get("resp_2") is not None
    assert len(store) == 2 and store.evictions == 1


def test_the_store_drops_the_oldest_responses_past_its_bytes_and_frees_them_on_delete():
    message = {"role": "user", "content": "x" * 10_000}
    one = estimated_bytes([stored_body(0), [message]])
    store = StoredResponses(max_records=100, ttl_seconds=3600, max_bytes=int(2.5 * one))
    for number in range(3):
        store.add(stored_body(number), [message], [message])
    assert [store.get(f"resp_{n}") is not None for n in range(3)] == [False, True, True]
    assert store.bytes == 2 * one
    assert store.delete("resp_1") and store.bytes == one


def test_an_expired_response_is_not_found():
    store = StoredResponses(max_records=10, ttl_seconds=-1.0, max_bytes=10**9)
    store.add(stored_body(0), [], [])
    assert store.get("resp_0") is None


# ---------------------------------------------------------------------------------- bad input


def request(**fields) -> dict:
    return {"model": "tiny", "input": "hi", "max_output_tokens": 4, **fields}


FUNCTION = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}

# (request body, status, param, words the message must contain)
BAD_REQUESTS = [
    ({"model": "tiny"}, 400, "input", "`input` is required"),
    (request(stream="yes"), 400, "stream", "valid boolean"),
    (request(max_output_tokens="4"), 400, "max_output_tokens", "valid integer"),
    (  # once `input[0].content`: "should be a valid string"
        request(input=[{"role": "user", "content": [{"type": "input_text"}]}]),
        400,
        "input[0].content[0]",
        "needs `text`",
    ),
    (request(input=5), 400, "input", "input"),
    (request(input=[{"type": "reasoning", "summary": []}]), 400, "input", "reasoning"),
    (request(input=[{"type": "item_reference", "id": "x"}]), 400, "input", "item references"),
    (request(input=[{"type": "web_search_call", "id": "x"}]), 400, "input", "built-in"),
    (request(input=[{"role": "robot", "content": "x"}]), 400, "input[0].role", "role"),
    (
        request(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
        400,
        "input[0].content",
        "text only",
    ),
    (
        request(input=[{"type": "function_call_output", "output": "7"}]),
        400,
        "input[0].call_id",
        "required",
    ),
    (request(tools=[{"type": "web_search"}]), 400, "tools", "built-in tools are not supported"),
    (request(tools=[{**FUNCTION, "name": "bad name"}]), 400, "tools[0].name", "1-64"),
    (request(tools=[{**FUNCTION, "defer_loading": True}]), 400, "tools[0].defer_loading", "drop"),
    (request(tool_choice="required"), 400, "tool_choice", "needs `tools`"),
    (
        request(tools=[FUNCTION], tool_choice={"type": "function", "name": "g"}),
        400,
        "tool_choice",
        "not in `tools`",
    ),
    (
        request(
            tools=[FUNCTION], tool_choice={"type": "allowed_tools", "mode": "auto", "tools": []}
        ),
        400,
        "tool_choice",
        "list only those",
    ),
    (
        request(text={"format": {"type": "json_schema", "name": "x"}}),
        400,
        "text.format",
        "needs `schema`",
    ),
    (request(text={"format": {"type": "xml"}}), 400, "text.format.type", "json_schema"),
    (
        request(
            tools=[FUNCTION],
            tool_choice="required",
            text={"format": {"type": "json_object"}},
        ),
        400,
        "text.format",
        "forced tool_choice",
    ),
    (request(text={"verbosity": "high"}), 400, "text.verbosity", "verbosity"),
    (request(background=True), 400, "background", "background"),
    (request(reasoning={"effort": "high"}), 400, "reasoning", "non-reasoning"),
    (request(conversation="conv_1"), 400, "conversation", "previous_response_id"),
    (request(n=2), 400, "n", "/v1/chat/completions"),
    (request(include=["everything"]), 400, "include", "message.output_text.logprobs"),
    (request(truncation="auto"), 400, "truncation", "disabled"),
    (request(temperature=2.5), 400, "temperature", "less than or equal to 2"),
    (request(top_p=0), 400, "top_p", "greater than 0"),
    (request(max_output_tokens=0), 400, "max_output_tokens", "greater than or equal to 1"),
    (request(max_output_tokens=100_000), 400, "max_output_tokens", "max_output_tokens"),
    (request(top_logprobs=21), 400, "top_logprobs", "less than or equal to 20"),
    (request(metadata={f"k{i}": "v" for i in range(17)}), 400, "metadata", "16"),
    (request(bogus=1), 400, "bogus", "Unrecognized request argument"),
    (request(input=[]), 400, "input", "empty"),
    (
        request(previous_response_id="resp_unknown"),
        400,
        "previous_response_id",
        "Send the whole conversation",
    ),
    (request(model="nope"), 404, "model", "does not exist"),
]


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    BAD_REQUESTS,
    ids=[f"{case[2]}-{i}" for i, case in enumerate(BAD_REQUESTS)],
)
def test_bad_requests_get_an_openai_error_naming_the_field(
    server: RunningServer, body, status, param, words
):
    response = httpx.post(f"{server.url}/v1/responses", json=body, headers=server.headers())
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object")],
)
def test_a_body_that_is_not_a_json_object_is_a_400(server: RunningServer, content, words):
    response = httpx.post(
        f"{server.url}/v1/responses",
        content=content,
        headers={**server.headers(), "content-type": "application/json"},
    )
    assert response.status_code == 400 and words in response.json()["error"]["message"]


def test_a_bad_streaming_request_fails_before_the_stream_starts(server: RunningServer):
    body = request(stream=True, max_output_tokens=100_000)
    response = httpx.post(f"{server.url}/v1/responses", json=body, headers=server.headers())
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["param"] == "max_output_tokens" and error["code"] == "context_length_exceeded"


def test_an_invalid_rollout_id_in_the_url_is_a_400(server: RunningServer):
    response = httpx.post(f"{server.url}/rollouts/bad%20id/v1/responses", json=request())
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "rollout_id"


def test_options_that_mean_off_are_accepted(client):
    response = client.responses.create(
        model="tiny",
        input="hi",
        max_output_tokens=2,
        background=False,
        reasoning={"effort": None},
        include=["reasoning.encrypted_content"],
        truncation="disabled",
        metadata={"run": "1"},
        store=True,
    )
    assert response.metadata == {"run": "1"}


# ---------------------------------------------------------------------- the OpenAI Agents SDK


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_agents_sdk_agent_runs_two_turns_and_both_are_recorded(
    server: RunningServer, tokenizer, streamed: bool
):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls: list[tuple[int, int]] = []

    @function_tool
    def add(a: Digit, b: Digit) -> int:
        """Add two digits."""
        calls.append((a, b))
        return a + b

    rollout_id = f"agents-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(
        base_url=f"{server.url}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=0
    )
    agent = Agent(
        name="adder",
        instructions="Use the add tool, then answer.",
        tools=[add],
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        # The first turn must call the tool (the grammar holds EOS back until the call is
        # whole); the SDK then resets tool_choice to auto, and the EOS bias ends the second
        # turn at once: the SDK fails a run on an incomplete (cut off) answer.
        model_settings=ModelSettings(
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0.0,
            max_tokens=120,
            extra_body={"logit_bias": {str(tokenizer.eos_token_id): 100}},
        ),
    )

    if streamed:
        result = Runner.run_streamed(agent, "What is 2 + 3?", max_turns=4)
        kinds = {event.type async for event in result.stream_events()}
        assert "raw_response_event" in kinds
    else:
        result = await Runner.run(agent, "What is 2 + 3?", max_turns=4)

    assert len(calls) == 1
    assert isinstance(result.final_output, str)
    records = rollout_records(server, rollout_id)
    assert len(records) == 2
    tool_message = records[1]["request"]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == str(sum(calls[0]))
    # Both turns are trainable turns of one history: the second call extends the first.
    trajectory = art.trajectory_from_records(records)
    choices = [item for item in trajectory.messages_and_choices if not isinstance(item, dict)]
    assert [choice.model_extra["completion_id"] for choice in choices] == [r["id"] for r in records]
    assert trajectory.additional_histories == []
