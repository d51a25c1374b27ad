"""A tool call cut by the token limit is dropped from the answer, on every route and in streams:
no client sees the model's `<tool_call>` markup as text, complete calls keep their order, and
the cut call's tokens stay in the usage and the token ids.

The tiny model is random: a forced tool choice makes it write `<tool_call>` blocks, and (where
the API takes one) a logit bias against EOS keeps it writing blocks until the limit. Each test
reads the route's own greedy answer first and takes a limit that ends inside a block from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from tests.support.chat_messages import ADD_TOOL
from tests.support.servers import RunningServer

QUESTION = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
MARKUP = ("<tool_call", "tool_call>", "<tool_", "</tool")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def no_eos(tokenizer: Any) -> dict[str, dict[str, int]]:
    return {"logit_bias": {str(tokenizer.eos_token_id): -100}}


def post(server: RunningServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stream(server: RunningServer, path: str, body: dict[str, Any]) -> tuple[str, list[dict]]:
    """The raw text of a streamed answer and its `data:` events, parsed."""
    url, body = f"{server.url}{path}", {**body, "stream": True}
    answer = httpx.post(url, json=body, headers=server.headers(), timeout=300)
    assert answer.status_code == 200, answer.text
    events = [
        json.loads(line.removeprefix("data: "))
        for line in answer.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    return answer.text, events


def cut_inside_a_call(tokenizer: Any, token_ids: list[int], after_calls: int) -> tuple[int, int]:
    """A token limit that ends inside the `<tool_call>` block after `after_calls` complete ones
    (a few tokens past its opening tag), and the number of complete calls before it."""
    for limit in range(1, len(token_ids)):
        text = tokenizer.decode(token_ids[:limit])
        if text.count("<tool_call>") == after_calls + 1 and text.endswith('{"name'):
            assert text.count("</tool_call>") == after_calls
            return limit + 4, after_calls
    raise AssertionError(f"no call after {after_calls} in {tokenizer.decode(token_ids)!r}")


def assert_no_markup(raw: str) -> None:
    for piece in MARKUP:
        assert piece not in raw, raw


# ------------------------------------------------------------------------- chat completions


def chat_body(limit: int, tokenizer: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": QUESTION,
        "tools": [ADD_TOOL],
        "tool_choice": "required",
        "temperature": 0.0,
        "max_tokens": limit,
        **no_eos(tokenizer),
    }


@pytest.mark.parametrize("after_calls", [0, 2])
def test_chat_drops_the_cut_call_and_keeps_the_complete_ones(
    server: RunningServer, tokenizer: Any, after_calls: int
):
    full = post(server, "/v1/chat/completions", chat_body(160, tokenizer))
    limit, complete = cut_inside_a_call(tokenizer, full["choices"][0]["token_ids"], after_calls)
    expected_calls = full["choices"][0]["message"]["tool_calls"][:complete]

    answer = post(server, "/v1/chat/completions", chat_body(limit, tokenizer))
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    calls = choice["message"].get("tool_calls") or []
    assert [call["function"] for call in calls] == [c["function"] for c in expected_calls]
    assert answer["usage"]["completion_tokens"] == limit == len(choice["token_ids"])
    assert_no_markup(json.dumps(answer["choices"][0]["message"]))

    body = {**chat_body(limit, tokenizer), "stream_options": {"include_usage": True}}
    raw, events = stream(server, "/v1/chat/completions", body)
    assert_no_markup(raw)
    deltas = [choice["delta"] for event in events for choice in event["choices"]]
    streamed = [call["function"] for delta in deltas for call in delta.get("tool_calls", [])]
    assert streamed == [call["function"] for call in expected_calls]
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == [
        "length"
    ]
    assert events[-1]["usage"]["completion_tokens"] == limit


# ---------------------------------------------------------------------------------- responses


def responses_body(limit: int, tokenizer: Any) -> dict[str, Any]:
    tool = {"type": "function", **ADD_TOOL["function"]}
    return {
        "model": "tiny",
        "input": QUESTION,
        "tools": [tool],
        "tool_choice": "required",
        "temperature": 0.0,
        "max_output_tokens": limit,
        **no_eos(tokenizer),
    }


def test_responses_drops_the_cut_call_and_is_incomplete(server: RunningServer, tokenizer: Any):
    full = post(server, "/v1/responses", responses_body(160, tokenizer))
    limit, complete = cut_inside_a_call(tokenizer, full["token_ids"], 1)

    answer = post(server, "/v1/responses", responses_body(limit, tokenizer))
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["type"] for item in answer["output"]] == ["function_call"] * complete
    assert answer["usage"]["output_tokens"] == limit
    assert_no_markup(json.dumps(answer["output"]))

    raw, events = stream(server, "/v1/responses", responses_body(limit, tokenizer))
    assert_no_markup(raw)
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert [item["type"] for item in final["output"]] == ["function_call"] * complete


# ----------------------------------------------------------------------------------- messages


def messages_body(limit: int) -> dict[str, Any]:
    tool = {
        "name": "add",
        "description": ADD_TOOL["function"]["description"],
        "input_schema": ADD_TOOL["function"]["parameters"],
    }
    return {
        "model": "tiny",
        "max_tokens": limit,
        "messages": QUESTION,
        "tools": [tool],
        "tool_choice": {"type": "any"},
        "temperature": 0.0,
    }


def test_messages_drops_the_cut_call_with_stop_reason_max_tokens(
    server: RunningServer, tokenizer: Any
):
    full = post(server, "/v1/messages", messages_body(160))
    limit, _ = cut_inside_a_call(tokenizer, full["token_ids"], 0)

    answer = post(server, "/v1/messages", messages_body(limit))
    assert answer["stop_reason"] == "max_tokens"
    assert answer["content"] == [{"type": "text", "text": ""}]
    assert answer["usage"]["output_tokens"] == limit == len(answer["token_ids"])

    raw, events = stream(server, "/v1/messages", messages_body(limit))
    assert_no_markup(raw)
    kinds = [event["type"] for event in events]
    assert "input_json_delta" not in raw and kinds[-1] == "message_stop"
    [delta] = [event for event in events if event["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == limit
