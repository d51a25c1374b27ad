"""Trajectory and TrajectoryGroup as ART 0.5.23 has them: finish, track_duration, for_logging,
messages(), the group's constructor arguments, ART's type aliases, and which turns train."""

from __future__ import annotations

import asyncio
import copy
import typing
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel

import art_core as art
from art_core.trajectories import group_payload
from art_core.wire import TurnRef


def choice(text: str, completion_id: str = "chatcmpl-1") -> Choice:
    return Choice.model_validate(
        {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "completion_id": completion_id,
        }
    )


def test_finish_records_the_runs_duration_and_returns_the_trajectory():
    trajectory = art.Trajectory(reward=1.0)
    assert trajectory.finish() is trajectory
    assert trajectory.metrics["duration"] >= 0.0
    assert "start_time" not in trajectory.model_dump()  # not saved, as in ART


async def test_track_duration_adds_up_seconds_under_name_duration_even_when_the_block_raises():
    trajectory = art.Trajectory()
    async with trajectory.track_duration("tool"):
        await asyncio.sleep(0)
    first = trajectory.metrics["tool_duration"]
    with pytest.raises(KeyError):
        async with trajectory.track_duration("tool"):
            raise KeyError("boom")
    assert trajectory.metrics["tool_duration"] >= first >= 0.0
    assert set(trajectory.metrics) == {"tool_duration"}


def test_for_logging_marks_choices_trainable_as_art_does():
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "2+2?"}, choice("4")],
        reward=0.5,
        metrics={"correct": True},
        metadata={"scenario": 3},
        logs=["ran"],
    )
    logged = trajectory.for_logging()
    assert logged["messages"] == [
        {"role": "user", "content": "2+2?", "trainable": False},
        {"role": "assistant", "content": "4", "trainable": True},
    ]
    assert {key: logged[key] for key in ("reward", "metrics", "metadata", "logs", "tools")} == {
        "reward": 0.5, "metrics": {"correct": True}, "metadata": {"scenario": 3},
        "logs": ["ran"], "tools": None,
    }  # fmt: skip
    assert logged["initial_policy_version"] is None and logged["final_policy_version"] is None
    assert str(trajectory).startswith("Trajectory(reward=0.5, metrics={'correct': True}")


def test_messages_are_copies_with_empty_content_for_none_as_art_gives_them():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    tool_turn = Choice.model_validate(
        {
            "index": 0,
            "message": {"role": "assistant", "content": None, "tool_calls": [call]},
            "finish_reason": "tool_calls",
        }
    )
    given = {"role": "assistant", "content": None}
    trajectory = art.Trajectory(messages_and_choices=[given, tool_turn])
    messages = trajectory.messages()
    assert messages == [
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    assert given["content"] is None  # the trajectory's own dict is untouched


async def test_group_takes_arts_constructor_arguments():
    error = ValueError("bad scenario")
    group = art.TrajectoryGroup(
        [art.Trajectory(reward=1.0), RuntimeError("rollout broke")],
        exceptions=[error],
        metadata={"scenario": "s1"},
        metrics={"judge_tokens": 12},
        logs=["judged"],
    )
    group.log("trained")
    assert group.rewards == [1.0]
    assert [e.type for e in group.exceptions] == ["RuntimeError", "ValueError"]  # ART's order
    assert (group.metadata, group.metrics, group.logs) == (
        {"scenario": "s1"}, {"judge_tokens": 12}, ["judged", "trained"],
    )  # fmt: skip
    copied = copy.copy(group)
    copied.logs.append("only the copy")
    assert copied.trajectories[0] is group.trajectories[0] and group.logs == ["judged", "trained"]
    deep = copy.deepcopy(group)
    assert deep.trajectories[0] is not group.trajectories[0]
    assert deep.rewards == [1.0] and len(deep.exceptions) == 2
    assert await art.TrajectoryGroup() is not None  # an empty group awaits to itself


def test_arts_type_aliases_are_exported():
    messages: art.Messages = [{"role": "user", "content": "hi"}]
    both: art.MessagesAndChoices = [*messages, choice("hello")]
    tools: art.Tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert typing.get_origin(art.Messages) is list
    assert typing.get_origin(art.MessagesAndChoices) is list
    assert typing.get_origin(art.Tools) is list
    assert (
        art.Trajectory(messages_and_choices=both, tools=tools).messages()[1]["content"] == "hello"
    )


# ------------------------------------------------------- LiteLLM's choice type (litellm is not
# installed in this environment: these classes have the shape of litellm.types.utils.Choices and
# Message, pydantic models where LiteLLM keeps fields it does not know, such as our completion_id,
# in `provider_specific_fields`).


class LiteLLMMessage(BaseModel):
    content: str | None
    role: str = "assistant"
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None
    provider_specific_fields: dict[str, Any] | None = None


class LiteLLMChoices(BaseModel):
    finish_reason: str = "stop"
    index: int = 0
    message: LiteLLMMessage
    provider_specific_fields: dict[str, Any] | None = None


def test_a_litellm_choices_with_our_completion_id_trains_like_an_openai_choice():
    litellm_choice = LiteLLMChoices(
        index=1,
        message=LiteLLMMessage(content="4"),
        provider_specific_fields={"completion_id": "chatcmpl-litellm"},
    )
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "2+2?"}, litellm_choice]
    )
    payload = group_payload(art.TrajectoryGroup([trajectory]))
    [history] = payload.trajectories[0].histories
    assert history.turns == [TurnRef(completion_id="chatcmpl-litellm", choice_index=1)]
    assert history.messages[1] == {"role": "assistant", "content": "4"}
    assert payload.trajectories[0].context_assistant_messages == 0
    assert trajectory.for_logging()["messages"][1]["trainable"] is True
    assert trajectory.messages()[1] == {"role": "assistant", "content": "4"}


def test_assistant_turns_without_an_id_are_sent_to_match_by_their_place():
    served_elsewhere = LiteLLMChoices(message=LiteLLMMessage(content="4"))
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},  # a plain dict, as tutorials write it
            {"role": "user", "content": "and 3+3?"},
            served_elsewhere,
            choice("6"),
        ]
    )
    payload = group_payload(art.TrajectoryGroup([trajectory]))
    assert payload.trajectories[0].histories[0].turns == [
        TurnRef(message_index=1),
        TurnRef(message_index=3),
        TurnRef(completion_id="chatcmpl-1", choice_index=0),
    ]  # in conversation order
    assert payload.trajectories[0].context_assistant_messages == 2
