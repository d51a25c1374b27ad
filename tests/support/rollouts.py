"""Rollouts for the tests: real chat completions from the backend, rewards computed by code."""

from __future__ import annotations

from collections.abc import Callable

import art_core as art


async def answer_rollout(
    model: art.TrainableModel,
    question: str,
    reward: Callable[[str], float] = lambda text: float(len(text) % 3),
    *,
    max_tokens: int = 8,
) -> art.Trajectory:
    """One question, one sampled answer, rewarded by `reward(answer text)`."""
    messages = [{"role": "user", "content": question}]
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=1.0,
    )
    choice = response.choices[0]
    return art.Trajectory(
        messages_and_choices=[*messages, choice], reward=reward(choice.message.content or "")
    )


async def groups_for(
    model: art.TrainableModel, questions: list[str], per_group: int = 4, **kwargs
) -> list[art.TrajectoryGroup]:
    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(answer_rollout(model, q, **kwargs) for _ in range(per_group))
            for q in questions
        ),
        pbar_desc=None,
    )


def varied_group(model_groups: list[art.TrajectoryGroup]) -> list[art.TrajectoryGroup]:
    """Give every group distinct rewards 0, 1, 2, ... so that each one trains."""
    for group in model_groups:
        for index, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(index)
    return model_groups
