"""Run rollouts concurrently: groups of trajectories for training, with a progress bar.

Exceptions are kept on their group and counted, and so is a rollout cancelled from inside (its
agent cancelled its own run); cancelling the gather itself stops it. Once more rollouts raised than
`max_exceptions` allows (a count, or a fraction of all rollouts when below 1), the gather stops
and raises `TooManyExceptionsError` with the first traceback.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tqdm.auto import tqdm

from art_core._errors import TooManyExceptionsError
from art_core._trajectory import RolloutException, Trajectory, TrajectoryGroup

logger = logging.getLogger("art_core.gather")

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None]]


class GatheredGroups(list[TrajectoryGroup]):
    """The groups a gather kept, in order; `dropped` counts those `after_each` dropped.

    `model.train(groups)` reports `dropped` as the step's `groups/dropped_before_training`.
    """

    dropped: int = 0


class _Progress:
    """The shared bar: rollouts done, running mean reward, exceptions; enforces the limit."""

    def __init__(
        self,
        total: int,
        desc: str | None,
        max_exceptions: int | float,
        show: bool,
        judged: bool = False,
    ):
        self.total = total
        self.bar = tqdm(total=total, desc=desc, disable=not show or not desc, dynamic_ncols=True)
        self.rewards: list[float] = []
        # With an `after_each` (a judge), rollouts' own rewards are placeholders: the bar shows
        # the rewards of the groups after_each returned instead.
        self.judged = judged
        self.judged_rewards: list[float] = []
        self.exceptions: list[RolloutException] = []
        self.allowed = _allowed_exceptions(max_exceptions, total)

    def done(self, result: Trajectory | RolloutException) -> None:
        if isinstance(result, Trajectory):
            self.rewards.append(result.reward)
        else:
            self.exceptions.append(result)
        self._show()
        self.bar.update(1)
        if len(self.exceptions) > self.allowed:
            raise TooManyExceptionsError(
                f"{len(self.exceptions)} of {self.total} rollouts raised, more than "
                f"max_exceptions allows ({self.allowed}).",
                first_traceback=self.exceptions[0].traceback,
            )

    def group_done(self, group: TrajectoryGroup | None) -> None:
        if self.judged and group is not None:
            self.judged_rewards += group.rewards
            self._show()
            self.bar.refresh()

    def _show(self) -> None:
        rewards = self.judged_rewards if self.judged else self.rewards
        postfix = {"reward": f"{sum(rewards) / len(rewards):.3f}"} if rewards else {}
        if self.exceptions:
            postfix["exceptions"] = str(len(self.exceptions))
        self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        self.bar.close()


def _allowed_exceptions(max_exceptions: int | float, total: int) -> int:
    if max_exceptions < 0:
        raise ValueError(f"max_exceptions must be >= 0, got {max_exceptions}")
    if isinstance(max_exceptions, float) and max_exceptions < 1:
        return math.floor(max_exceptions * total)
    return int(max_exceptions)


async def _run_one(
    rollout: Awaitable[Trajectory], progress: _Progress
) -> Trajectory | RolloutException:
    try:
        result = await rollout
        if not isinstance(result, Trajectory):
            raise TypeError(f"a rollout must return an art.Trajectory, got {type(result).__name__}")
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # the gather itself is cancelled (Ctrl-C, the exception limit): stop
        # Cancelled from inside (the agent cancelled its own run): a failed rollout, kept.
        outcome: Trajectory | RolloutException = RolloutException.from_exception(error)
    except Exception as error:  # noqa: BLE001 - a rollout's failure is data: kept on the group
        outcome = RolloutException.from_exception(error)
    else:
        outcome = result
    progress.done(outcome)
    return outcome


async def _run_group(
    group: TrajectoryGroup, progress: _Progress, after_each: AfterEach | None
) -> TrajectoryGroup | None:
    pending, group._pending = group._pending, []
    for outcome in await asyncio.gather(*(_run_one(p, progress) for p in pending)):
        if isinstance(outcome, Trajectory):
            group.trajectories.append(outcome)
        else:
            group.exceptions.append(outcome)
    if after_each is not None:
        judged = await after_each(group)
        progress.group_done(judged)
        return judged
    return group


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup | Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    after_each: AfterEach | None = None,
    show_progress: bool = True,
) -> GatheredGroups:
    """Run every pending rollout of every group concurrently; returns the groups in order.

    `after_each(group)` runs as soon as a group's rollouts finish (e.g. an LLM judge) and may
    return a new group, or None to drop it (logged, and counted in `.dropped`). Exceptions stay
    on their groups.
    """
    resolved: list[TrajectoryGroup] = []
    for item in groups:
        group = await item if inspect.isawaitable(item) else item
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"expected art.TrajectoryGroup, got {type(group).__name__}")
        resolved.append(group)
    progress = _Progress(
        sum(len(g._pending) for g in resolved),
        pbar_desc,
        max_exceptions,
        show_progress,
        judged=after_each is not None,
    )
    try:
        results = await _gather_or_cancel(
            [_run_group(group, progress, after_each) for group in resolved]
        )
    finally:
        progress.close()
    kept = GatheredGroups(group for group in results if group is not None)
    kept.dropped = len(results) - len(kept)
    if kept.dropped:
        logger.warning("after_each dropped %d of %d groups", kept.dropped, len(results))
    return kept


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory]],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    show_progress: bool = True,
) -> list[Trajectory]:
    """Run rollouts concurrently and return the trajectories (exceptions counted, not returned)."""
    group = TrajectoryGroup(trajectories)
    [result] = await gather_trajectory_groups(
        [group], pbar_desc=pbar_desc, max_exceptions=max_exceptions, show_progress=show_progress
    )
    return result.trajectories


async def _gather_or_cancel(coroutines: list[Any]) -> list[Any]:
    """asyncio.gather that cancels the siblings when one raises (the exception limit)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
