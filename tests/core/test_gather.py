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
    started = 0
    all_started = asyncio.Event()

    async def counted(reward: float) -> art.Trajectory:
        nonlocal started
        started += 1
        if started == 12:
            all_started.set()
        # Run one after another, the first would wait here for the other eleven forever.
        await asyncio.wait_for(all_started.wait(), timeout=60)
        return await rollout(reward)

    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(counted(g + i / 10) for i in range(4)) for g in range(3)),
        pbar_desc=None,
    )
    assert [group.rewards for group in groups] == [
        [0.0, 0.1, 0.2, 0.3], [1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3],
    ]  # fmt: skip
    assert started == 12


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


async def test_gather_trajectories_returns_results_in_order_with_exceptions_in_place():
    # ART: within max_exceptions a rollout's exception is returned where its trajectory would be.
    async def two() -> list[art.Trajectory]:
        return [await rollout(3.0), await rollout(4.0)]

    results = await art.gather_trajectories(
        [rollout(1.0, delay=0.05), rollout(0.0, fail=True), two()],
        pbar_desc=None,
        max_exceptions=1,
    )
    assert isinstance(results[0], art.Trajectory) and results[0].reward == 1.0
    assert isinstance(results[1], RuntimeError) and "rollout failed" in str(results[1])
    assert [t.reward for t in results[2]] == [3.0, 4.0]


async def test_gather_trajectories_past_the_limit_raises_with_the_rollouts_error_as_cause():
    with pytest.raises(art.TooManyExceptionsError) as raised:
        await art.gather_trajectories([rollout(1.0), rollout(0.0, fail=True)], pbar_desc=None)
    assert isinstance(raised.value.__cause__, RuntimeError)


async def test_gather_trajectories_refuses_a_result_that_is_no_trajectory():
    async def text() -> str:
        return "no"

    [result] = await art.gather_trajectories([text()], pbar_desc=None, max_exceptions=1)
    assert isinstance(result, TypeError) and "art.Trajectory" in str(result)


async def test_a_group_is_awaitable_and_keeps_the_input_order():
    group = art.TrajectoryGroup(rollout(r, delay=0.05 * (3 - r)) for r in range(3))
    assert await group is group
    assert group.rewards == [0.0, 1.0, 2.0] and group._pending == []
    assert await group is group  # awaiting again runs nothing


async def test_awaiting_a_group_alone_raises_its_first_exception_and_cancels_the_rest():
    cancelled = asyncio.Event()

    async def slow() -> art.Trajectory:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not cancelled")

    with pytest.raises(RuntimeError, match="rollout failed"):
        await art.TrajectoryGroup([slow(), rollout(0.0, fail=True)])
    assert cancelled.is_set()


async def test_groups_built_by_coroutines_run_concurrently_and_report_to_the_gather():
    # Group A's rollout waits for group B's: run one after another, this would never finish.
    b_ran = asyncio.Event()

    async def rollout_a() -> art.Trajectory:
        await b_ran.wait()
        return await rollout(1.0)

    async def rollout_b() -> art.Trajectory:
        b_ran.set()
        return await rollout(2.0)

    async def group_of(make) -> art.TrajectoryGroup:
        return await art.TrajectoryGroup([make(), rollout(0.0, fail=True)])

    groups = await asyncio.wait_for(
        art.gather_trajectory_groups(
            [group_of(rollout_a), group_of(rollout_b)], pbar_desc=None, max_exceptions=2
        ),
        timeout=30,
    )
    assert [g.rewards for g in groups] == [[1.0], [2.0]]
    assert [len(g.exceptions) for g in groups] == [1, 1]  # kept: inside the gather's limit


async def test_a_group_awaitable_that_raises_is_counted_and_left_out():
    async def broken() -> art.TrajectoryGroup:
        raise ValueError("no scenario")

    async def built() -> art.TrajectoryGroup:
        return art.TrajectoryGroup([await rollout(1.0), await rollout(2.0)])

    groups = await art.gather_trajectory_groups(
        [broken(), built()], pbar_desc=None, max_exceptions=1
    )
    assert [g.rewards for g in groups] == [[1.0, 2.0]] and groups.dropped == 1
    with pytest.raises(art.TooManyExceptionsError, match="no scenario"):
        await art.gather_trajectory_groups([broken()], pbar_desc=None)


async def test_after_each_may_return_several_groups():
    async def split(group: art.TrajectoryGroup) -> list[art.TrajectoryGroup]:
        return [art.TrajectoryGroup([t]) for t in group]

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([rollout(1.0), rollout(2.0)])], pbar_desc=None, after_each=split
    )
    assert [g.rewards for g in groups] == [[1.0], [2.0]] and groups.dropped == 0


async def test_arts_progress_options_are_taken():
    with pytest.warns(DeprecationWarning, match="pbar_total_completion_tokens"):
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup([rollout(1.0)])],
            pbar_desc=None,
            max_metrics=1,
            pbar_total_completion_tokens=True,
        )
    assert groups[0].rewards == [1.0]


def test_a_group_refuses_what_is_not_a_trajectory():
    with pytest.raises(TypeError, match="Trajectory"):
        art.TrajectoryGroup(["text"])  # type: ignore[list-item]


async def test_training_an_ungathered_group_is_a_clear_error(tiny_model_dir):
    coroutine = rollout(1.0)
    group = art.TrajectoryGroup([coroutine])
    with pytest.raises(art.InvalidTrajectoryError, match="gather_trajectory_groups"):
        art.RemoteBackend("http://127.0.0.1:9")._groups_payload([group])
    coroutine.close()


def test_with_a_judge_the_bar_shows_judged_rewards_not_placeholders():
    from art_core.gather import _Progress

    progress = _Progress(2, "gather", 0, show=True, judged=True)
    progress.done(art.Trajectory(reward=0.0))
    progress.done(art.Trajectory(reward=0.0))
    assert "reward" not in (progress.bar.postfix or "")
    progress.group_done(
        art.TrajectoryGroup([art.Trajectory(reward=0.5), art.Trajectory(reward=1.0)])
    )
    assert "reward=0.750" in progress.bar.postfix
    progress.close()
