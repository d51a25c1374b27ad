"""SFT sequences: a conversation tokenised as serving renders it, its assistant turns trained.

With the tiny model's ChatML template (no tool support), tool definitions, calls and results are
the Hermes-style text serving writes, so SFT teaches the tokens the model samples when serving.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from art_backend.engines._tool_calls import prepare_messages
from art_backend.training._rows import sft_sequence

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "c2", "content": '{"wind": 3}'},
    {"role": "assistant", "content": "21 degrees."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def trained_text(tokenizer, sequence) -> str:
    return tokenizer.decode(sequence.input_ids[sequence.trained_mask].tolist())


def serving_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt ids serving builds for a request with these messages and TOOLS."""
    prepared = prepare_messages(messages, TOOLS, supports_tools=False)
    text = tokenizer.apply_chat_template(prepared, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_tool_call_trains_as_the_text_serving_parses(tokenizer):
    sequence = sft_sequence(tokenizer, TOOL_CHAT, TOOLS)
    trained = trained_text(tokenizer, sequence)
    assert "<tool_call>" in trained and '"get_weather"' in trained and "21 degrees." in trained
    context = tokenizer.decode(sequence.input_ids[~sequence.trained_mask].tolist())
    assert "<tools>" in context and context.count("<tool_response>") == 2
    # Before each answer, the sequence is exactly the prompt serving builds for that request.
    first = serving_prompt(tokenizer, TOOL_CHAT[:1])
    assert sequence.input_ids[: len(first)].tolist() == first
    assert not sequence.trained_mask[: len(first)].any()
    second = serving_prompt(tokenizer, TOOL_CHAT[:4])
    assert sequence.input_ids[: len(second)].tolist() == second


def test_last_trains_only_the_final_answer_on_the_same_tokens(tokenizer):
    every = sft_sequence(tokenizer, TOOL_CHAT, TOOLS)
    last = sft_sequence(tokenizer, TOOL_CHAT, TOOLS, assistant_turns="last")
    assert last.input_ids.tolist() == every.input_ids.tolist()
    assert "<tool_call>" not in trained_text(tokenizer, last)
    assert trained_text(tokenizer, last).startswith("21 degrees.")
    assert 0 < int(last.trained_mask.sum()) < int(every.trained_mask.sum())


def test_a_conversation_without_an_assistant_turn_is_refused(tokenizer):
    with pytest.raises(ValueError, match="at least one assistant message"):
        sft_sequence(tokenizer, [{"role": "user", "content": "hi"}])
