"""trajectory_group_batches: batches of finished groups, in the order they finish, as ART's."""

from __future__ import annotations

import asyncio

import pytest

import art_core as art


async def rollout(reward: float, *, fail: bool = False, wait: asyncio.Event | None = None):
    if wait is not None:
        await wait.wait()
    if fail:
        raise RuntimeError(f"rollout {reward} failed")
    return art.Trajectory(reward=reward)


async def collect(batches) -> list[list[list[float]]]:
    return [[group.rewards for group in batch] async for batch in batches]


async def test_batches_come_in_the_order_groups_finish_with_a_last_smaller_one():
    first_batch_seen = asyncio.Event()
    groups = [
        art.TrajectoryGroup([rollout(0.0, wait=first_batch_seen)]),  # first given, last done
        art.TrajectoryGroup([rollout(1.0)]),
        art.TrajectoryGroup([rollout(2.0)]),
    ]
    result = []
    async for batch in art.trajectory_group_batches(groups, batch_size=2, pbar_desc=None):
        result.append(sorted(group.rewards for group in batch))
        first_batch_seen.set()
    assert result == [[[1.0], [2.0]], [[0.0]]]


async def test_at_most_batch_size_times_max_concurrent_batches_run_at_once():
    running = 0
    peak = 0

    async def counted(reward: float) -> art.Trajectory:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return art.Trajectory(reward=reward)

    groups = [art.TrajectoryGroup([counted(float(i))]) for i in range(10)]
    batches = art.trajectory_group_batches(
        groups, batch_size=2, max_concurrent_batches=2, pbar_desc=None
    )
    result = await collect(batches)
    assert sorted(r for batch in result for [r] in batch) == [float(i) for i in range(10)]
    assert all(len(batch) == 2 for batch in result)
    assert peak == 4


async def test_skip_batches_skips_groups_without_running_them():
    ran: list[int] = []

    async def noted(index: int) -> art.Trajectory:
        ran.append(index)
        return art.Trajectory(reward=float(index))

    groups = [art.TrajectoryGroup([noted(i)]) for i in range(5)]
    result = await collect(
        art.trajectory_group_batches(groups, batch_size=2, skip_batches=1, pbar_desc=None)
    )
    assert sorted(ran) == [2, 3, 4]
    assert sorted(len(batch) for batch in result) == [1, 2]


async def test_exceptions_stay_on_groups_within_the_limit_and_raise_past_it():
    groups = [art.TrajectoryGroup([rollout(1.0), rollout(0.0, fail=True)]) for _ in range(2)]
    [batch] = await collect(
        art.trajectory_group_batches(groups, batch_size=2, max_batch_exceptions=2, pbar_desc=None)
    )
    assert batch == [[1.0], [1.0]]
    groups = [art.TrajectoryGroup([rollout(1.0), rollout(0.0, fail=True)]) for _ in range(2)]
    with pytest.raises(art.TooManyExceptionsError, match=r"rollout 0\.0 failed"):
        await collect(
            art.trajectory_group_batches(
                groups, batch_size=2, max_batch_exceptions=1, pbar_desc=None
            )
        )


async def test_a_group_awaitable_that_raises_is_left_out_and_counted():
    async def broken() -> art.TrajectoryGroup:
        raise ValueError("no scenario")

    async def fine() -> art.TrajectoryGroup:
        return art.TrajectoryGroup([art.Trajectory(reward=1.0)])

    result = await collect(
        art.trajectory_group_batches(
            [broken(), fine()], batch_size=1, max_batch_exceptions=1, pbar_desc=None
        )
    )
    assert result == [[[1.0]]]
    with pytest.raises(art.TooManyExceptionsError, match="no scenario"):
        await collect(art.trajectory_group_batches([broken()], batch_size=1, pbar_desc=None))


async def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="batch_size"):
        await collect(art.trajectory_group_batches([], batch_size=0))
