"""RecordedAnswers: which recorded completion a plain-dict assistant turn trains on."""

from __future__ import annotations

from typing import Any

from art_backend.training._rows import RecordedAnswers, message_key

QUESTION = [{"role": "user", "content": "2+2?"}]


def record(
    answer: dict[str, Any],
    *,
    messages: list[dict[str, Any]] = QUESTION,
    rollout_id: str | None = None,
    model: str = "agent@0",
    at: float = 0.0,
    tokens: list[int] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    sampled = tokens or [7, 8]
    return {
        "id": f"chatcmpl-{at}",
        "recorded_at": at,
        "rollout_id": rollout_id,
        "model": model,
        "request": {"messages": messages},
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", **answer},
                "finish_reason": "stop",
                "token_ids": sampled,
                "logprobs": [-0.5] * len(sampled),
            }
        ],
    }


def find(records: list[dict[str, Any]], answer: dict[str, Any], **kwargs: Any):
    return RecordedAnswers(records).find(QUESTION, {"role": "assistant", **answer}, **kwargs)


def test_the_same_conversation_and_answer_give_the_recorded_tokens():
    turn = find([record({"content": "4"}, tokens=[40, 2])], {"content": "4"})
    assert turn is not None
    assert (turn.prompt_token_ids, turn.token_ids, turn.logprobs) == (
        [1, 2, 3],
        [40, 2],
        [-0.5] * 2,
    )


def test_an_edited_answer_or_another_conversation_matches_nothing():
    records = [record({"content": "4"})]
    assert find(records, {"content": "4."}) is None
    assert find(records, {"content": "four"}) is None
    other = RecordedAnswers(records).find(
        [{"role": "user", "content": "3+1?"}], {"role": "assistant", "content": "4"}
    )
    assert other is None  # the same answer to another question is not this turn


def test_the_trajectorys_rollout_wins_then_the_trained_model_then_the_newest():
    records = [
        record({"content": "4"}, rollout_id="rollout-a", at=1.0, tokens=[1]),
        record({"content": "4"}, model="other@3", at=3.0, tokens=[3]),
        record({"content": "4"}, model="agent@1", at=2.0, tokens=[2]),
    ]
    assert find(records, {"content": "4"}, rollout_id="rollout-a").token_ids == [1]
    assert find(records, {"content": "4"}, model_name="agent").token_ids == [2]
    assert find(records, {"content": "4"}).token_ids == [3]


def test_tool_calls_match_by_name_and_arguments_not_by_id():
    call = {"id": "call-1", "type": "function", "function": {"name": "add", "arguments": "[2,2]"}}
    records = [record({"content": None, "tool_calls": [call]})]
    renamed = {**call, "id": "call-other"}
    assert find(records, {"content": "", "tool_calls": [renamed]}) is not None
    other_args = {**call, "function": {"name": "add", "arguments": "[2,3]"}}
    assert find(records, {"content": "", "tool_calls": [other_args]}) is None


def test_message_key_joins_text_parts_and_ignores_other_fields():
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "2?"}],
    }
    assert message_key(parts) == message_key({"role": "user", "content": "2+2?", "name": "x"})


def test_a_stripped_answer_trains_the_recorded_tokens_whitespace_included():
    # Tutorials keep `completion.choices[0].message.content.strip()` as the answer.
    turn = find([record({"content": " 4\n"}, tokens=[5, 40, 9])], {"content": "4"})
    assert turn is not None and turn.token_ids == [5, 40, 9]
