"""POST /v1/messages through the real `anthropic` SDK and LangChain's ChatAnthropic.

Anthropic's Messages API is a translation over chat completions, so these tests pin the
translation: the prompt a Messages request renders is the prompt of the equivalent chat
request, the answer carries the exact token ids, errors come in Anthropic's shape, and a
two-turn tool agent written with the SDK inside `model.rollout()` trains. The tiny model is
random: tool calls are forced with tool_choice "any".
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

import art_core as art
from tests.support.chat_messages import ADD_TOOL as CHAT_ADD_TOOL
from tests.support.models import fresh_model
from tests.support.servers import RunningServer

QUESTION = "What is the capital of France?"
# The chat tool in Anthropic's shape: `input_schema` for `parameters`.
ADD_TOOL = {
    "name": "add",
    "description": CHAT_ADD_TOOL["function"]["description"],
    "input_schema": CHAT_ADD_TOOL["function"]["parameters"],
}
ONE_CALL = {"type": "any", "disable_parallel_tool_use": True}
GREEDY = {"extra_body": {"temperature": 0.0}}  # this SDK's create() no longer names it


@pytest.fixture
def claude(server: RunningServer) -> anthropic.Anthropic:
    """The real anthropic SDK: it appends /v1/messages to the server's root."""
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def chat_prompt_ids(client: openai.OpenAI, messages: list[dict], **fields) -> list[int]:
    """The prompt token ids the chat API renders for these messages (the reference)."""
    response = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=1, **fields
    )
    return response.model_extra["prompt_token_ids"]


def rollout_records(server: RunningServer, rollout_id: str) -> list[dict]:
    response = httpx.get(f"{server.url}/v1/rollouts/{rollout_id}", headers=server.headers())
    assert response.status_code == 200
    return response.json()["completions"]


def add(a: int, b: int) -> int:
    return a + b


def run_tool_agent(client: anthropic.Anthropic, model: str) -> tuple[list, list[dict]]:
    """A plain two-turn tool agent, as an Anthropic SDK user writes it: call the model, run
    each tool_use, send the tool_results back, until the model stops asking for tools."""
    messages: list[dict] = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
    answers = []
    tool_choice: dict = ONE_CALL  # the random tiny model calls a tool only when made to
    for _ in range(4):
        answer = client.messages.create(
            model=model,
            max_tokens=60,
            system="You add numbers with the add tool.",
            messages=messages,
            tools=[ADD_TOOL],
            tool_choice=tool_choice,  # type: ignore[arg-type]
            **GREEDY,
        )
        answers.append(answer)
        messages.append({"role": "assistant", "content": answer.content})
        if answer.stop_reason != "tool_use":
            break
        results = [
            {"type": "tool_result", "tool_use_id": block.id, "content": str(add(**block.input))}
            for block in answer.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
        tool_choice = {"type": "auto"}
    return answers, messages


# -------------------------------------------------------------------------------- plain answers


def test_a_message_answers_with_text_and_its_exact_tokens(claude, client):
    answer = claude.messages.create(
        model="tiny",
        max_tokens=12,
        system="Answer briefly.",
        messages=[{"role": "user", "content": QUESTION}],
    )
    assert answer.type == "message" and answer.role == "assistant"
    assert answer.id.startswith("msg_") and answer.model == "tiny"
    [block] = answer.content
    assert block.type == "text"
    assert answer.stop_reason in {"end_turn", "max_tokens"}
    prompt_ids = answer.model_extra["prompt_token_ids"]
    assert prompt_ids == chat_prompt_ids(
        client,
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
    )
    assert answer.usage.input_tokens == len(prompt_ids)
    assert answer.usage.output_tokens == len(answer.model_extra["token_ids"])


def test_system_blocks_and_text_blocks_render_as_the_chat_messages(claude, client):
    answer = claude.messages.create(
        model="tiny",
        max_tokens=2,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "More"},
        ],
        metadata={"user_id": "someone"},
    )
    assert answer.model_extra["prompt_token_ids"] == chat_prompt_ids(
        client,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "More"},
        ],
    )


def test_max_tokens_cuts_the_answer(claude):
    answer = claude.messages.create(
        model="tiny", max_tokens=1, messages=[{"role": "user", "content": QUESTION}]
    )
    assert answer.usage.output_tokens == 1
    assert answer.stop_reason in {"max_tokens", "end_turn"}  # one token may be EOS


def test_a_stop_sequence_ends_the_answer_and_is_named(claude):
    # Greedy answers are reproducible: one long enough to cut is cut inside its text.
    for question in (QUESTION, "Hi", "Tell me a story.", "Count to ten.", "Why?"):
        request = {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": question}],
            "extra_body": {"top_k": 1},
        }
        text = claude.messages.create(**request).content[0].text
        if len(text) >= 6:  # often newlines: the random model repeats its likeliest token
            break
    else:
        pytest.skip("no greedy answer of the random model is long enough to cut")
    stop = text[3:6]
    stopped = claude.messages.create(**request, stop_sequences=[stop, "never-sampled"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.find(stop)]


def test_sampling_fields_are_honoured_greedy_equals_chat(claude, client):
    answer = claude.messages.create(
        model="tiny",
        max_tokens=8,
        messages=[{"role": "user", "content": "Hi"}],
        extra_body={"temperature": 0.0, "top_p": 0.9, "top_k": 5},
    )
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0.0
    )
    assert answer.model_extra["token_ids"] == chat.choices[0].model_extra["token_ids"]


def test_count_tokens_is_the_rendered_prompt_length(claude, client):
    counted = claude.messages.count_tokens(
        model="tiny", messages=[{"role": "user", "content": QUESTION}]
    )
    expected = chat_prompt_ids(client, [{"role": "user", "content": QUESTION}])
    assert counted.input_tokens == len(expected)


# ------------------------------------------------------------------------------------ streaming


def test_streamed_events_follow_anthropics_sequence_and_spell_the_answer(claude):
    request = {
        "model": "tiny",
        "max_tokens": 12,
        "messages": [{"role": "user", "content": QUESTION}],
        **GREEDY,
    }
    whole = claude.messages.create(**request)
    events = list(claude.messages.create(**request, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert set(kinds[2:-3]) <= {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text
    start, delta = events[0], events[-2]
    assert start.message.usage.input_tokens == whole.usage.input_tokens
    assert delta.delta.stop_reason == whole.stop_reason
    assert delta.usage.output_tokens == whole.usage.output_tokens


def test_the_sdk_stream_helper_gives_the_final_message(claude):
    request = {
        "model": "tiny",
        "max_tokens": 12,
        "messages": [{"role": "user", "content": QUESTION}],
        **GREEDY,
    }
    whole = claude.messages.create(**request)
    with claude.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.model_extra["completion_id"].startswith("chatcmpl-")


def test_a_streamed_tool_use_sends_its_input_as_json(claude):
    with claude.messages.stream(
        model="tiny",
        max_tokens=60,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ADD_TOOL],
        tool_choice=ONE_CALL,
        **GREEDY,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    [block] = final.content
    assert block.type == "tool_use" and block.name == "add"
    assert set(block.input) == {"a", "b"}
    assert final.stop_reason == "tool_use"
    assert "input_json" in kinds  # the SDK's own event for an input_json_delta


# ------------------------------------------------------------------------------------- tools


def test_a_two_turn_tool_agent_renders_the_chat_conversation_and_is_recorded(
    server: RunningServer, client
):
    rollout_id = f"messages-{uuid.uuid4().hex[:8]}"
    rollout = anthropic.Anthropic(
        base_url=f"{server.url}/rollouts/{rollout_id}", api_key="unused", max_retries=0
    )
    answers, messages = run_tool_agent(rollout, "tiny")
    assert len(answers) >= 2 and answers[0].stop_reason == "tool_use"
    [call] = answers[0].content
    assert call.type == "tool_use" and set(call.input) == {"a", "b"}

    # The second prompt is the chat conversation: system, user, the call, the tool's answer.
    chat_call = {
        "id": call.id,
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps(call.input)},
    }
    expected = chat_prompt_ids(
        client,
        [
            {"role": "system", "content": "You add numbers with the add tool."},
            messages[0],
            {"role": "assistant", "content": None, "tool_calls": [chat_call]},
            {"role": "tool", "tool_call_id": call.id, "content": str(add(**call.input))},
        ],
        tools=[CHAT_ADD_TOOL],
    )
    assert answers[1].model_extra["prompt_token_ids"] == expected

    records = rollout_records(server, rollout_id)
    assert [r["id"] for r in records] == [a.model_extra["completion_id"] for a in answers]
    for record, answer in zip(records, answers, strict=True):
        assert record["prompt_token_ids"] == answer.model_extra["prompt_token_ids"]
        assert record["choices"][0]["token_ids"] == answer.model_extra["token_ids"]
    # One history: the second call extends the first, exactly as recorded.
    trajectory = art.trajectory_from_records(records)
    assert trajectory.additional_histories == []


async def test_the_anthropic_sdk_trains_a_two_turn_tool_agent_in_a_rollout_scope(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    trajectories = []
    for reward in (0.0, 1.0):
        async with model.rollout() as r:
            # The SDK appends /v1/messages itself: the scope's URL without its /v1.
            client = anthropic.Anthropic(
                base_url=r.base_url.removesuffix("/v1"), api_key=r.api_key, max_retries=0
            )
            answers, _ = run_tool_agent(client, r.model)
            r.reward = reward
        assert answers[0].stop_reason == "tool_use"
        trajectory = r.trajectory
        roles = [m["role"] for m in trajectory.messages()]
        assert roles[:5] == ["system", "user", "assistant", "tool", "assistant"]
        assert trajectory.additional_histories == []
        trajectories.append(trajectory)
    result = await model.train([art.TrajectoryGroup(trajectories)])
    assert result.step == 1
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # exact tokens


def test_langchain_chat_anthropic_runs_a_tool_loop(server: RunningServer):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, ToolMessage

    rollout_id = f"langchain-{uuid.uuid4().hex[:8]}"
    chat = ChatAnthropic(
        model="tiny",
        base_url=f"{server.url}/rollouts/{rollout_id}",
        api_key="unused",
        max_tokens=60,
        max_retries=0,
        temperature=0.0,
    )
    # The tool in Anthropic's own shape (bounded digits: greedy decoding of an unbounded
    # integer writes digits until the token budget ends).
    messages: list = [HumanMessage("What is 2 + 3?")]
    first = chat.bind_tools([ADD_TOOL], tool_choice="any").invoke(messages)
    [call] = first.tool_calls
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"}
    messages += [first, ToolMessage(str(add(**call["args"])), tool_call_id=call["id"])]
    second = chat.bind_tools([ADD_TOOL]).invoke(messages)
    assert second.usage_metadata["output_tokens"] >= 1

    records = rollout_records(server, rollout_id)
    assert len(records) == 2
    assert records[1]["request"]["messages"][-1]["role"] == "tool"
    assert art.trajectory_from_records(records).additional_histories == []


# ------------------------------------------------------------------------------ errors and keys


def test_x_api_key_is_accepted_and_a_wrong_key_is_an_anthropic_authentication_error(
    keyed_server: RunningServer,
):
    right = anthropic.Anthropic(base_url=keyed_server.url, api_key="secret-key", max_retries=0)
    answer = right.messages.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert answer.type == "message"
    wrong = anthropic.Anthropic(base_url=keyed_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        wrong.messages.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert raised.value.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in raised.value.body["error"]["message"]


def test_an_unknown_model_is_an_anthropic_not_found_error(claude):
    with pytest.raises(anthropic.NotFoundError) as raised:
        claude.messages.create(
            model="nope", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert raised.value.body["error"]["type"] == "not_found_error"
    assert "Served models: tiny" in raised.value.body["error"]["message"]


def request(**fields) -> dict:
    return {
        "model": "tiny",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
THINKING = {"type": "thinking", "thinking": "hm", "signature": "s"}

# (request body, status, param, words the message must contain)
BAD_REQUESTS = [
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, 400, "max_tokens", ""),
    (request(max_tokens=0), 400, "max_tokens", "greater than or equal to 1"),
    (request(messages=[]), 400, "messages", "at least 1"),
    (
        request(messages=[{"role": "user", "content": [IMAGE]}]),
        400,
        "messages[0].content",
        "images",
    ),
    (
        request(messages=[{"role": "assistant", "content": [THINKING]}]),
        400,
        "messages[0].content",
        "thinking",
    ),
    (
        request(messages=[{"role": "user", "content": [{"type": "tool_use", "id": "x"}]}]),
        400,
        "messages[0].content",
        "cannot hold tool_use",
    ),
    *(  # a block type that is not a string (once a 500: unhashable type 'dict')
        (
            request(messages=[{"role": "user", "content": [{"type": kind}]}]),
            400,
            "messages[0].content",
            "must be a string naming the block",
        )
        for kind in ({}, [], 7)
    ),
    (
        request(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "x", "citations": [{}]}]}
            ]
        ),
        400,
        "messages[0].content[0].citations",
        "",
    ),
    (request(thinking={"type": "enabled", "budget_tokens": 2048}), 400, "thinking", "thinking"),
    (request(tools=[{"type": "web_search_20250305", "name": "web"}]), 400, "tools", "client tool"),
    (request(tools=[{"name": "bad name", "input_schema": {}}]), 400, "tools[0].name", "1-64"),
    (request(tool_choice={"type": "any"}), 400, "tool_choice", "needs `tools`"),
    (
        request(tools=[ADD_TOOL], tool_choice={"type": "tool", "name": "sub"}),
        400,
        "tool_choice",
        "not in `tools`",
    ),
    (request(mcp_servers=[{"type": "url", "url": "x"}]), 400, "mcp_servers", "MCP"),
    (
        request(output_config={"format": {"type": "json_schema", "schema": {}}}),
        400,
        "output_config",
        "response_format",
    ),
    (request(stop_sequences=[f"s{i}" for i in range(257)]), 400, "stop_sequences", "at most 256"),
    (request(stop_sequences=["x" * 9_000] * 2), 400, "stop_sequences", "16,384 characters"),
    (request(temperature=1.5), 400, "temperature", "less than or equal to 1"),
    (request(max_tokens=100_000), 400, "max_tokens", "max_tokens"),
    (request(bogus=1), 400, "bogus", "Extra inputs"),
    (request(model="nope"), 404, "model", "does not exist"),
    # Strict booleans, as the rest of the API: "yes" once streamed.
    (request(stream="yes"), 400, "stream", "valid boolean"),
    (request(stream=1), 400, "stream", "valid boolean"),
    (request(max_tokens="4"), 400, "max_tokens", "valid integer"),
    # A union's error names the branch the value was meant for (once: "system: should be a
    # valid string" for a list of blocks).
    (request(system=[{"type": "text"}]), 400, "system[0].text", "Field required"),
]


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    BAD_REQUESTS,
    ids=[f"{case[2]}-{i}" for i, case in enumerate(BAD_REQUESTS)],
)
def test_bad_requests_get_an_anthropic_error_naming_the_field(
    server: RunningServer, body, status, param, words
):
    response = httpx.post(f"{server.url}/v1/messages", json=body, headers=server.headers())
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["type"] == "error"
    error = answer["error"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert error["param"] == param
    assert words in error["message"]


def test_a_body_that_is_not_json_is_an_anthropic_400(server: RunningServer):
    response = httpx.post(
        f"{server.url}/v1/messages",
        content=b"{not json",
        headers={**server.headers(), "content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_bad_streaming_request_fails_before_the_stream_starts(claude):
    with pytest.raises(anthropic.BadRequestError) as raised:
        claude.messages.create(
            model="tiny",
            max_tokens=100_000,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
    assert raised.value.body["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------------------------------ unknown routes


def test_an_unknown_route_names_the_apis_the_server_speaks(server: RunningServer):
    response = httpx.get(f"{server.url}/v1/nothing-here", headers=server.headers())
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    for api in ("Chat Completions", "Responses", "Anthropic Messages", "training", "/v1/models"):
        assert api in message


def test_a_doubled_v1_is_explained_to_an_anthropic_client(server: RunningServer):
    doubled = anthropic.Anthropic(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as raised:
        doubled.messages.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert "without /v1" in raised.value.body["error"]["message"]


async def test_a_bug_behind_a_messages_route_is_a_500_in_anthropics_shape_and_is_logged(caplog):
    """Were the app's handler to answer it, an Anthropic SDK would get OpenAI's shape."""
    from art_backend.serving.messages._service import in_anthropic_shape

    async def broken() -> None:
        raise TypeError("unhashable type: 'dict'")

    response = await in_anthropic_shape(broken())
    assert response.status_code == 500
    body = json.loads(response.body)
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert body["error"]["message"] == "Internal error: TypeError: unhashable type: 'dict'"
    assert "unexpected error" in caplog.text


async def test_the_apps_own_http_answers_pass_through_a_messages_route():
    """A body over --max-body-mb read inside the route is the app's 413, not a bug's 500."""
    from art_backend._errors import RequestBodyTooLarge
    from art_backend.serving.messages._service import in_anthropic_shape

    async def too_large() -> None:
        raise RequestBodyTooLarge("The request body is larger than this server's limit.")

    with pytest.raises(RequestBodyTooLarge):
        await in_anthropic_shape(too_large())


def test_a_number_past_a_double_s_range_in_a_tool_argument_stays_strict_json():
    """The model wrote 1e999 into a loose tool's argument: the tool_use input keeps the text it
    wrote, so a client that sends the call back (httpx refuses inf) does not fail."""
    from art_backend.engines._tool_calls import parse_tool_calls
    from art_backend.serving.messages._output import content_blocks

    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1e999, "b": NaN}}\n</tool_call>'
    content, calls = parse_tool_calls(text, {"add"})
    [block] = content_blocks({"content": content, "tool_calls": calls})
    assert block["input"] == {"a": "1e999", "b": "NaN"}
    httpx.Request("POST", "http://x", json={"content": [block]})  # raised ValueError before
