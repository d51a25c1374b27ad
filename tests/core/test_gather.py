"""Gathering rollouts: concurrency, exceptions kept and counted, the exception limit, after_each."""

from __future__ import annotations

import asyncio

import pytest

import art_core as art


async def rollout(reward: float, *, fail: bool = False, delay: float = 0.0) -> art.Trajectory:
    await asyncio.sleep(delay)
    if fail:
        raise RuntimeError(f"rollout failed at reward {reward}")
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=reward)


async def test_groups_keep_order_and_rollouts_run_concurrently():
    started = asyncio.get_running_loop().time()
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(g + i / 10, delay=0.2) for i in range(4)) for g in range(3)),
        pbar_desc=None,
    )
    elapsed = asyncio.get_running_loop().time() - started
    assert [group.rewards for group in groups] == [
        [0.0, 0.1, 0.2, 0.3], [1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3],
    ]  # fmt: skip
    assert elapsed < 12 * 0.2  # not one after another (a loose bound: this is not a timing test)


async def test_exceptions_are_kept_on_their_group_within_the_limit():
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([rollout(1.0), rollout(0.0, fail=True), rollout(2.0)])],
        pbar_desc=None,
        max_exceptions=1,
    )
    [group] = groups
    assert group.rewards == [1.0, 2.0]
    assert len(group.exceptions) == 1
    assert group.exceptions[0].type == "RuntimeError"
    assert "rollout failed" in group.exceptions[0].traceback


async def test_past_the_limit_it_raises_with_the_first_traceback():
    with pytest.raises(art.TooManyExceptionsError, match="rollout failed") as raised:
        await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(0.0, fail=True) for _ in range(3))],
            pbar_desc=None,
            max_exceptions=0.5,  # a fraction: 1 of 3 allowed
        )
    assert "2 of 3 rollouts raised" in str(raised.value)


async def test_a_rollout_returning_something_else_is_an_exception():
    async def bad() -> str:
        return "not a trajectory"

    [group] = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([bad(), rollout(1.0)])], pbar_desc=None, max_exceptions=1
    )
    assert group.exceptions[0].type == "TypeError"


async def test_after_each_can_replace_or_drop_groups():
    async def judge(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        if max(group.rewards) < 1:
            return None
        for trajectory in group.trajectories:
            trajectory.metrics["judged"] = True
        return group

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([rollout(0.0)]), art.TrajectoryGroup([rollout(1.0)])],
        pbar_desc=None,
        after_each=judge,
    )
    assert len(groups) == 1 and groups[0].trajectories[0].metrics["judged"] is True


async def test_gather_trajectories_returns_the_successes():
    trajectories = await art.gather_trajectories(
        [rollout(1.0), rollout(0.0, fail=True)], pbar_desc=None, max_exceptions=1
    )
    assert [t.reward for t in trajectories] == [1.0]


def test_a_group_refuses_what_is_not_a_trajectory():
    with pytest.raises(TypeError, match="Trajectory"):
        art.TrajectoryGroup(["text"])  # type: ignore[list-item]


async def test_training_an_ungathered_group_is_a_clear_error(tiny_model_dir):
    coroutine = rollout(1.0)
    group = art.TrajectoryGroup([coroutine])
    with pytest.raises(art.InvalidTrajectoryError, match="gather_trajectory_groups"):
        art.RemoteBackend("http://127.0.0.1:9")._groups_payload([group], {})
    coroutine.close()


def test_with_a_judge_the_bar_shows_judged_rewards_not_placeholders():
    from art_core._gather import _Progress

    progress = _Progress(2, "gather", 0, show=True, judged=True)
    progress.done(art.Trajectory(reward=0.0))
    progress.done(art.Trajectory(reward=0.0))
    assert "reward" not in (progress.bar.postfix or "")
    progress.group_done(
        art.TrajectoryGroup([art.Trajectory(reward=0.5), art.Trajectory(reward=1.0)])
    )
    assert "reward=0.750" in progress.bar.postfix
    progress.close()
