"""The server through the real openai SDK: OpenAI's fields, exact tokens, batching and rollouts.

The tiny model is random, so these tests check structure, token-level consistency and
determinism, never meaning. Its greedy output is one token repeated ("\\n"), so where a test needs
varied yet deterministic text it decodes greedily with a frequency penalty (`VARIED_GREEDY`).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.support.chat_messages import ADD_TOOL, assistant_tool_calls, tool_result
from tests.support.servers import RunningServer

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
# Greedy decoding is deterministic; the penalty stops the random model repeating one token.
VARIED_GREEDY = {"temperature": 0.0, "frequency_penalty": 2.0}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER_TOOL, ADD_TOOL]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def no_eos(tokenizer) -> dict[str, int]:
    """A logit_bias that bans EOS, so a completion runs to max_tokens."""
    return {str(tokenizer.eos_token_id): -100}


@pytest.fixture
def tools_client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat_template_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def token_ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def assert_arguments_fit(tool: dict, arguments: dict) -> None:
    """The few JSON-schema rules the test tools use: required keys, enums, integer bounds."""
    schema = tool["function"]["parameters"]
    assert set(arguments) == set(schema["required"])
    for key, value in arguments.items():
        rule = schema["properties"][key]
        if "enum" in rule:
            assert value in rule["enum"]
        if rule["type"] == "integer":
            assert isinstance(value, int) and rule["minimum"] <= value <= rule["maximum"]


def rollout(server: RunningServer, rollout_id: str) -> list[dict]:
    response = httpx.get(f"{server.url}/v1/rollouts/{rollout_id}", headers=server.headers())
    assert response.status_code == 200
    return response.json()["completions"]


# ----------------------------------------------------------------------------- plain completions


def test_completion_reports_the_exact_prompt_and_completion_tokens(client, tokenizer):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20)

    prompt_ids = response.model_extra["prompt_token_ids"]
    assert prompt_ids == chat_template_ids(tokenizer, MESSAGES)
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert (
        response.usage.total_tokens
        == response.usage.prompt_tokens + response.usage.completion_tokens
    )
    choice = response.choices[0]
    assert isinstance(choice.message.content, str)
    assert len(token_ids(choice)) == response.usage.completion_tokens
    assert tokenizer.decode(token_ids(choice), skip_special_tokens=True) == choice.message.content


def test_max_tokens_cuts_the_completion_with_finish_reason_length(client, no_eos):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=5, logit_bias=no_eos
    )
    assert response.usage.completion_tokens == 5
    assert response.choices[0].finish_reason == "length"


def test_max_completion_tokens_cuts_the_completion_too(client, no_eos):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=3, logit_bias=no_eos
    )
    assert response.usage.completion_tokens == 3
    assert response.choices[0].finish_reason == "length"


# ------------------------------------------------------------------------------------ streaming


@pytest.mark.parametrize(
    "sampling",
    [VARIED_GREEDY, {"temperature": 0.0}, {"temperature": 1.0, "seed": 11}],
    ids=["greedy-penalised", "greedy", "seeded"],
)
def test_streamed_deltas_and_token_ids_equal_the_non_streamed_completion(client, sampling):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 24, **sampling}
    whole = client.chat.completions.create(**request)

    text, streamed_ids = "", []
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            streamed_ids += choice.model_extra.get("token_ids") or []

    assert text == whole.choices[0].message.content
    assert streamed_ids == token_ids(whole.choices[0])


def test_stream_include_usage_ends_with_a_usage_chunk_without_choices(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == sum(
        len(choice.model_extra.get("token_ids") or []) for c in chunks for choice in c.choices
    )
    assert last.usage.prompt_tokens == len(chunks[0].model_extra["prompt_token_ids"])
    assert all(chunk.usage is None for chunk in chunks[:-1])


# -------------------------------------------------------------------------------- n and sampling


@pytest.mark.torch_engine  # reads the torch engine's prefill and batch counters
def test_n_choices_share_one_prefill_of_the_prompt(client, server: RunningServer):
    before = server.metrics()["art_prefill_tokens_total"]
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, n=4, max_tokens=8)
    after = server.metrics()["art_prefill_tokens_total"]

    assert sorted(choice.index for choice in response.choices) == [0, 1, 2, 3]
    assert after - before == len(response.model_extra["prompt_token_ids"])


def test_logprobs_give_one_entry_per_token_with_sorted_top_logprobs(client):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=10, logprobs=True, top_logprobs=3
    )
    choice = response.choices[0]
    entries = choice.logprobs.content
    sampled = choice.model_extra["sampled_logprobs"]

    assert len(entries) == len(token_ids(choice)) == len(sampled)
    for entry, sampled_logprob in zip(entries, sampled, strict=True):
        tops = [top.logprob for top in entry.top_logprobs]
        assert len(tops) == 3
        assert tops == sorted(tops, reverse=True)
        assert entry.logprob <= tops[0] + 1e-5
        assert entry.logprob == pytest.approx(sampled_logprob, abs=1e-4)
        assert all(value <= 0 for value in [entry.logprob, *tops])


def test_the_same_seed_reproduces_a_sampled_completion(client):
    def sample(seed: int) -> list[int]:
        response = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0, seed=seed
        )
        return token_ids(response.choices[0])

    assert sample(1234) == sample(1234)
    assert any(sample(seed) != sample(seed + 1) for seed in (1, 3, 5))


def test_a_large_logit_bias_forces_its_token_under_greedy_decoding(client, tokenizer):
    [token_a] = tokenizer.encode("a", add_special_tokens=False)
    assert token_a != tokenizer.eos_token_id

    response = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0.0,
        logit_bias={str(token_a): 100},
    )
    assert token_ids(response.choices[0]) == [token_a] * 8
    assert response.choices[0].message.content == "a" * 8


def test_presence_and_frequency_penalties_are_accepted(client):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, presence_penalty=1.5, frequency_penalty=-1.0
    )
    assert response.choices[0].finish_reason in {"stop", "length"}


def test_frequency_penalty_reduces_repeated_tokens_under_greedy_decoding(client):
    def most_repeats(frequency_penalty: float) -> int:
        response = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=30,
            temperature=0.0,
            frequency_penalty=frequency_penalty,
        )
        return max(Counter(token_ids(response.choices[0])).values())

    assert most_repeats(2.0) < most_repeats(0.0)


def test_a_stop_string_ends_the_content_before_its_first_occurrence(client):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 40, **VARIED_GREEDY}
    text = client.chat.completions.create(**request).choices[0].message.content
    # A short printable stop string taken from the middle of the unstopped text.
    start = next(
        i
        for i in range(len(text) // 2, len(text) - 1)
        if text[i : i + 2].isascii() and text[i : i + 2].isalnum()
    )
    stop = text[start : start + 2]

    response = client.chat.completions.create(**request, stop=[stop])

    assert response.choices[0].message.content == text[: text.index(stop)]
    assert response.choices[0].finish_reason == "stop"


# ------------------------------------------------------------------------------------------ tools


@pytest.mark.torch_engine  # greedy ends the grammar on the torch-shaped tiny model's weights
def test_required_tool_choice_returns_valid_calls_of_the_given_tools(tools_client):
    # Sampled, the random model may chain calls until max_tokens; greedy stops after one.
    response = tools_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=120,
        temperature=0.0,
    )
    choice = response.choices[0]
    tools_by_name = {tool["function"]["name"]: tool for tool in TOOLS}

    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in tools_by_name
        assert_arguments_fit(tools_by_name[call.function.name], json.loads(call.function.arguments))


def test_a_named_tool_choice_forces_that_tool(tools_client):
    response = tools_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=120,
    )
    calls = response.choices[0].message.tool_calls
    assert calls and {call.function.name for call in calls} == {"add"}
    for call in calls:
        assert_arguments_fit(ADD_TOOL, json.loads(call.function.arguments))


def test_parallel_tool_calls_false_returns_exactly_one_call(tools_client):
    response = tools_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
    )
    assert len(response.choices[0].message.tool_calls) == 1
    assert response.choices[0].finish_reason == "tool_calls"


def test_auto_tool_choice_answers_with_content_or_tool_calls(tools_client):
    response = tools_client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=30
    )
    message = response.choices[0].message
    assert isinstance(message.content, str) or message.tool_calls


def test_a_tool_result_turn_is_accepted(tools_client):
    messages = [
        *MESSAGES,
        assistant_tool_calls(("get_weather", '{"city": "Paris", "unit": "c"}')),
        tool_result("call_1", '{"temperature": 21}'),
    ]
    response = tools_client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, max_tokens=10
    )
    assert response.choices[0].finish_reason in {"stop", "length", "tool_calls"}


# -------------------------------------------------------------------------------- response_format


def test_json_schema_response_format_yields_a_valid_object(client):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]},
            "rank": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["city", "rank"],
        "additionalProperties": False,
    }
    response = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=200,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    answer = json.loads(response.choices[0].message.content)
    assert set(answer) == {"city", "rank"}
    assert answer["city"] in {"Paris", "Rome", "Berlin"}
    assert isinstance(answer["rank"], int) and 1 <= answer["rank"] <= 5


@pytest.mark.torch_engine  # greedy ends the grammar on the torch-shaped tiny model's weights
def test_json_object_response_format_yields_a_json_object(client):
    response = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=200,
        temperature=0.0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(response.choices[0].message.content), dict)


# ------------------------------------------------------------------------------------- batching


@pytest.mark.torch_engine  # reads the torch engine's prefill and batch counters
async def test_concurrent_requests_are_decoded_in_one_batch(
    async_client, server: RunningServer, no_eos
):
    before = server.metrics()

    responses = await asyncio.gather(
        *(
            async_client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Count to {i}."}],
                max_tokens=16,
                logit_bias=no_eos,  # every request decodes all 16 tokens
            )
            for i in range(32)
        )
    )
    after = server.metrics()

    assert all(response.usage.completion_tokens == 16 for response in responses)
    assert after["art_batch_size_max"] > 1

    def decode_rows(metrics: dict[str, float]) -> float:
        return metrics["art_batch_size_mean"] * max(metrics["art_decode_steps_total"], 1)

    steps = after["art_decode_steps_total"] - before["art_decode_steps_total"]
    # Mean rows per decode step during these requests (~30 observed; 1 if run one by one).
    assert (decode_rows(after) - decode_rows(before)) / steps > 8


# ----------------------------------------------------------------------------- rollout capture


def test_completions_under_a_rollout_url_are_recorded_in_order(server: RunningServer):
    rollout_client = openai.OpenAI(
        base_url=f"{server.url}/rollouts/r-123/v1", api_key="unused", max_retries=0
    )
    responses = [
        rollout_client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6)
        for _ in range(2)
    ]

    records = rollout(server, "r-123")

    assert [record["id"] for record in records] == [response.id for response in responses]
    for record, response in zip(records, responses, strict=True):
        assert record["rollout_id"] == "r-123"
        assert record["prompt_token_ids"] == response.model_extra["prompt_token_ids"]
        assert record["choices"][0]["token_ids"] == token_ids(response.choices[0])


def test_the_rollout_id_header_records_under_that_rollout(client, server: RunningServer):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, extra_headers={"X-Rollout-Id": "r-456"}
    )
    records = rollout(server, "r-456")
    assert [record["id"] for record in records] == [response.id]


def test_a_completion_record_is_readable_by_its_id(client, server: RunningServer):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)

    record = httpx.get(f"{server.url}/v1/chat/completions/{response.id}").json()

    assert record["id"] == response.id
    assert record["rollout_id"] is None
    assert record["prompt_token_ids"] == response.model_extra["prompt_token_ids"]
    assert record["choices"][0]["token_ids"] == token_ids(response.choices[0])
    assert record["choices"][0]["logprobs"] == response.choices[0].model_extra["sampled_logprobs"]


def test_an_unknown_rollout_has_no_completions(server: RunningServer):
    assert rollout(server, "never-used") == []


def test_streamed_completions_are_recorded_with_their_tokens(client, server: RunningServer):
    streamed_ids, completion_id = [], None
    for chunk in client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=6,
        stream=True,
        extra_headers={"X-Rollout-Id": "r-stream"},
    ):
        completion_id = chunk.id
        for choice in chunk.choices:
            streamed_ids += choice.model_extra.get("token_ids") or []

    [record] = rollout(server, "r-stream")
    assert record["id"] == completion_id
    assert record["choices"][0]["token_ids"] == streamed_ids


# ---------------------------------------------------------------------------------------- models


def test_models_lists_the_served_name(client):
    assert "tiny" in [model.id for model in client.models.list()]


def test_models_are_listed_under_a_rollout_url_too(server: RunningServer):
    rollout_client = openai.OpenAI(
        base_url=f"{server.url}/rollouts/x/v1", api_key="unused", max_retries=0
    )
    assert "tiny" in [model.id for model in rollout_client.models.list()]


def test_sse_events_stay_on_one_line_for_splitlines_clients():
    from art_backend.serving._sse import sse_json

    body = {"content": "a\u2028b\u2029c\x85d\x1ce\nf é"}
    encoded = sse_json(body)
    assert len(f"data: {encoded}".splitlines()) == 1
    assert json.loads(encoded) == body
    assert "é" in encoded  # UTF-8 text is not ASCII-escaped
