"""Plain-dict assistant turns, as tutorial code writes them, train on the recorded tokens.

`{"role": "assistant", "content": response.choices[0].message.content}` carries no completion
id; the backend finds the completion it recorded with the same conversation and answer and
trains its exact tokens. A turn whose text matches nothing is counted and named in a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import art_core as art
from tests.support.models import fresh_model

QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


async def tutorial_rollout(
    model: art.TrainableModel, question: str, reward: float
) -> tuple[art.Trajectory, int]:
    """ART's tutorial shape: the answer text kept as a plain dict, not the Choice."""
    messages = [{"role": "user", "content": question}]
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=1.0,
    )
    answer = response.choices[0].message.content or ""
    trajectory = art.Trajectory(
        messages_and_choices=[*messages, {"role": "assistant", "content": answer}], reward=reward
    )
    assert response.usage is not None
    return trajectory, response.usage.completion_tokens


async def test_plain_dict_answers_train_on_the_tokens_the_server_sampled(
    model: art.TrainableModel,
):
    groups, sampled = [], 0
    for question in QUESTIONS:
        group = art.TrajectoryGroup()
        for reward in range(4):
            trajectory, tokens = await tutorial_rollout(model, question, float(reward))
            group.trajectories.append(trajectory)
            sampled += tokens
        groups.append(group)
    result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    assert result.step == 1
    assert result.metrics["context_assistant_messages"] == 8
    assert result.metrics["matched_assistant_messages"] == 8
    assert result.metrics["dropped/unmatched_assistant_messages"] == 0
    assert result.metrics["trained_tokens"] == sampled  # every sampled token, none re-tokenized
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # the sampler's logprobs


async def test_an_answer_that_matches_no_completion_is_counted_and_warned(
    model: art.TrainableModel,
):
    group = art.TrajectoryGroup()
    for reward in range(3):
        trajectory, _ = await tutorial_rollout(model, "What is 4 + 4?", float(reward))
        if reward == 0:  # edited after sampling: its tokens are not the model's
            trajectory.messages_and_choices[-1]["content"] += " (edited)"
        group.trajectories.append(trajectory)
    result = await model.train([group])
    assert result.metrics["matched_assistant_messages"] == 2
    assert result.metrics["dropped/unmatched_assistant_messages"] == 1
    assert result.metrics["dropped/no_trainable_turns"] == 1
    assert any("match no completion" in warning for warning in result.warnings)


async def test_a_dict_turn_before_a_choice_trains_both_turns(model: art.TrainableModel):
    client = model.openai_client()
    group, sampled = art.TrajectoryGroup(), 0
    for reward in range(2):
        messages: list[Any] = [{"role": "user", "content": "Count with me."}]
        first = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_tokens=4
        )
        messages.append({"role": "assistant", "content": first.choices[0].message.content})
        messages.append({"role": "user", "content": "Go on."})
        second = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_tokens=4
        )
        assert first.usage is not None and second.usage is not None
        sampled += first.usage.completion_tokens + second.usage.completion_tokens
        group.trajectories.append(
            art.Trajectory(messages_and_choices=[*messages, second.choices[0]], reward=reward)
        )
    result = await model.train([group])
    assert result.metrics["matched_assistant_messages"] == 2
    assert result.metrics["trained_tokens"] == sampled  # the dict turn and the choice both
