"""Run rollouts concurrently: groups of trajectories for training, with a progress bar.

Exceptions are kept on their group and counted, and so is a rollout cancelled from inside (its
agent cancelled its own run); cancelling the gather itself stops it. Once more rollouts raised than
`max_exceptions` allows (a count, or a fraction of all rollouts when below 1), the gather stops
and raises `TooManyExceptionsError` with the first traceback (the rollout's own exception is its
`__cause__`; ART raises that exception itself).

The groups may be `TrajectoryGroup(rollouts)` or any awaitable of a group (an `async def` that
builds one); all run concurrently. A group's awaitable that raises counts as one exception and
its group is left out (as in ART), counted in `GatheredGroups.dropped`.

Not taken from ART: trajectories get no `metrics["completion_tokens"]` added by the gather (ART
counts vLLM's token ids on each Choice; our server's step metrics count trained tokens instead).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import warnings
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tqdm.auto import tqdm

from art_core.errors import TooManyExceptionsError
from art_core.trajectories import (
    RolloutException,
    Trajectory,
    TrajectoryGroup,
    current_observer,
    gather_or_cancel,
)
from art_core.utils._loops import BatchGroups

__all__ = ["GatheredGroups", "gather_trajectories", "gather_trajectory_groups"]

logger = logging.getLogger("art_core.gather")

AfterEach = Callable[[TrajectoryGroup], Awaitable["TrajectoryGroup | list[TrajectoryGroup] | None"]]


class GatheredGroups(list[TrajectoryGroup]):
    """The groups a gather kept, in order; `dropped` counts those left out (an `after_each`
    returned None, or the group's own awaitable raised).

    `model.train(groups)` reports `dropped` as the step's `groups/dropped_before_training`, and
    `counts` (a GroupSignal's `signal/...` counts of the step) among the step's metrics.
    """

    dropped: int = 0
    counts: dict[str, float] = {}  # noqa: RUF012 - replaced per instance, never mutated


class _Progress:
    """The shared bar: rollouts done, running means of reward and metrics, exceptions; it
    enforces the exception limit. It is the `RolloutObserver` of the groups it runs."""

    def __init__(
        self,
        total: int,
        desc: str | None,
        max_exceptions: int | float,
        show: bool,
        judged: bool = False,
        max_metrics: int | None = None,
    ):
        self.total = total
        self.bar = tqdm(total=total, desc=desc, disable=not show or not desc, dynamic_ncols=True)
        self.max_exceptions = max_exceptions
        self.max_metrics = max_metrics
        self.metric_sums: dict[str, float] = {}
        self.metric_counts: dict[str, int] = {}
        # With an `after_each` (a judge), rollouts' own rewards are placeholders: the bar shows
        # the rewards of the groups after_each returned instead.
        self.judged = judged
        self.exceptions: list[RolloutException] = []
        self.first_error: BaseException | None = None
        self.allowed = _allowed_exceptions(max_exceptions, total)
        self.counted: set[int] = set()  # groups whose rollouts are already in `total`

    def started(self, group: TrajectoryGroup, count: int) -> None:
        if id(group) in self.counted:
            return
        self.counted.add(id(group))
        self.grow(count)

    def grow(self, count: int) -> None:
        """More rollouts than known at the start (a group awaited inside a gathered coroutine)."""
        self.total += count
        self.bar.total = self.total
        self.allowed = _allowed_exceptions(self.max_exceptions, self.total)

    def done(
        self, result: Trajectory | RolloutException, error: BaseException | None = None
    ) -> None:
        if isinstance(result, Trajectory):
            if not self.judged:
                self._record(result)
        else:
            self.exceptions.append(result)
            if self.first_error is None:
                self.first_error = error
        self._show()
        self.bar.update(1)
        self.check()

    def check(self) -> None:
        if len(self.exceptions) > self.allowed:
            raise TooManyExceptionsError(
                f"{len(self.exceptions)} of {self.total} rollouts raised, more than "
                f"max_exceptions allows ({self.allowed}).",
                first_traceback=self.exceptions[0].traceback,
            ) from self.first_error

    def group_done(self, group: TrajectoryGroup | None) -> None:
        if self.judged and group is not None:
            for trajectory in group.trajectories:
                self._record(trajectory)
            self._show()
            self.bar.refresh()

    def _record(self, trajectory: Trajectory) -> None:
        values = {"reward": trajectory.reward, **trajectory.metrics}
        for name, value in values.items():
            if isinstance(value, int | float) and math.isfinite(value):
                self.metric_sums[name] = self.metric_sums.get(name, 0.0) + float(value)
                self.metric_counts[name] = self.metric_counts.get(name, 0) + 1

    def _show(self) -> None:
        names = list(self.metric_sums)
        if self.max_metrics is not None:
            names = names[: self.max_metrics]
        postfix = {
            name: f"{self.metric_sums[name] / self.metric_counts[name]:.3f}" for name in names
        }
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


class _Failed:
    """A group's awaitable raised: its group is left out."""


_FAILED = _Failed()


class _Counting:
    """Forwards to the gather's progress, noting whether a group reported its rollouts."""

    def __init__(self, progress: _Progress) -> None:
        self.progress = progress
        self.reported = False

    def started(self, group: TrajectoryGroup, count: int) -> None:
        self.reported = True
        self.progress.started(group, count)

    def done(self, outcome: Trajectory | RolloutException, error: BaseException | None) -> None:
        self.progress.done(outcome, error)


async def _group_of(item: Any, progress: _Progress) -> TrajectoryGroup | _Failed:
    """Run one item of a gather to its group; a failing awaitable is one counted exception."""
    if isinstance(item, TrajectoryGroup):
        return await item
    # This task's own observer: whether the awaitable's rollouts reached the bar.
    counting = _Counting(progress)
    current_observer.set(counting)
    try:
        group = await item
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"expected art.TrajectoryGroup, got {type(group).__name__}")
        group = await group  # a group returned with its rollouts still pending
        if not counting.reported:
            # Built from finished trajectories: they reach the bar now.
            progress.grow(len(group.trajectories))
            for trajectory in group.trajectories:
                progress.done(trajectory)
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        progress.grow(1)
        progress.done(RolloutException.from_exception(error), error)
        return _FAILED
    except TooManyExceptionsError:
        raise
    except Exception as error:  # noqa: BLE001 - a failed group is counted, as ART does
        progress.grow(1)
        progress.done(RolloutException.from_exception(error), error)
        logger.warning(
            "a group's rollout raised %s: %s; group left out", type(error).__name__, error
        )
        return _FAILED
    return group


async def _forward(
    item: Any, progress: _Progress, after_each: AfterEach | None
) -> list[TrajectoryGroup] | _Failed | None:
    group = await _group_of(item, progress)
    if isinstance(group, _Failed):
        return group
    if after_each is None:
        return [group]
    judged = await after_each(group)
    if judged is None:
        return None
    judged_list = judged if isinstance(judged, list) else [judged]
    for each in judged_list:
        progress.group_done(each)
    return judged_list


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup | Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
    max_metrics: int | None = None,
    after_each: AfterEach | None = None,
    show_progress: bool = True,
) -> GatheredGroups:
    """Run every pending rollout of every group concurrently; returns the groups in order.

    `after_each(group)` runs as soon as a group's rollouts finish (e.g. an LLM judge) and may
    return a new group, a list of groups (each kept), or None to drop it (logged, and counted in
    `.dropped`). Exceptions stay on their groups. `max_metrics` limits how many metric means
    the bar shows; `pbar_total_completion_tokens` is deprecated in ART and ignored here too.

    `groups=batch.groups(make_group)` of a batch from `iterate_dataset(..., signal=...)`: each
    group is recorded in the signal, and all-equal groups are replaced by more of the dataset
    while the step has fewer than `min_trainable_groups` with mixed rewards (see GroupSignal).
    """
    if pbar_total_completion_tokens:
        warnings.warn(
            "pbar_total_completion_tokens is deprecated (as in ART) and ignored",
            DeprecationWarning,
            stacklevel=2,
        )
    if isinstance(groups, BatchGroups) and groups.batch.signal is not None:
        return await _gather_with_signal(
            groups, pbar_desc, max_exceptions, show_progress, after_each, max_metrics
        )
    items = list(groups)
    for item in items:
        if not isinstance(item, TrajectoryGroup) and not inspect.isawaitable(item):
            raise TypeError(f"expected art.TrajectoryGroup, got {type(item).__name__}")
    progress = _Progress(
        0, pbar_desc, max_exceptions, show_progress, after_each is not None, max_metrics
    )
    for item in items:
        if isinstance(item, TrajectoryGroup):
            progress.started(item, len(item._pending))
    # The tasks copy this context: a group awaited inside a gathered coroutine reports here.
    token = current_observer.set(progress)
    try:
        results = await gather_or_cancel([_forward(item, progress, after_each) for item in items])
    finally:
        current_observer.reset(token)
        progress.close()
    kept = _gathered(results)
    judged_out = sum(1 for result in results if result is None)
    if judged_out:
        logger.warning("after_each dropped %d of %d groups", judged_out, len(results))
    return kept


async def _gather_with_signal(
    source: BatchGroups[Any],
    pbar_desc: str | None,
    max_exceptions: int | float,
    show_progress: bool,
    after_each: AfterEach | None,
    max_metrics: int | None,
) -> GatheredGroups:
    """A batch's groups with its GroupSignal: each finished group is recorded against its item.
    With `min_trainable_groups`, the step starts as many groups as the last step's share of
    groups with signal calls for, then, while fewer than that carry signal (counting the running
    ones as if they will), replaces each all-equal group by the dataset's next item, up to
    `max_groups_per_step` groups. Groups come back in the order they were started."""
    signal = source.batch.signal
    assert signal is not None
    target = signal.min_trainable_groups
    limit = max(signal.max_groups_per_step or 0, len(source.batch.items))
    progress = _Progress(
        0, pbar_desc, max_exceptions, show_progress, after_each is not None, max_metrics
    )
    started: dict[asyncio.Future[Any], Any] = {}  # task -> its item, in the order started
    running: set[asyncio.Future[Any]] = set()

    def start(item: Any) -> None:
        group = source.make_group(item)
        if isinstance(group, TrajectoryGroup):
            progress.started(group, len(group._pending))
        elif not inspect.isawaitable(group):
            raise TypeError(
                f"batch.groups(make_group): make_group returned {type(group).__name__}, not an "
                "art.TrajectoryGroup or an awaitable of one"
            )
        task = asyncio.ensure_future(_forward(group, progress, after_each))
        started[task] = item
        running.add(task)

    def draw(count: int) -> None:
        """Start up to `count` more of the dataset's next items, within the bound (counted)."""
        for _ in range(min(count, limit - len(started))):
            drawn = source.batch.draw() if source.batch.draw is not None else None
            if drawn is None:
                return
            signal.count_extra()
            start(drawn[0])

    token = current_observer.set(progress)
    try:
        for item in source.batch.items:
            start(item)
        # Sampled beside the batch from the start: the last step's share says so.
        draw(signal.groups_to_start(len(started)) - len(started))
        trainable = 0
        while running:
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            running.difference_update(finished)
            for task in finished:
                result = task.result()  # TooManyExceptionsError: the siblings are cancelled
                kept = result if isinstance(result, list) else []
                if any([signal.record(started[task], group) for group in kept]):
                    trainable += 1
            if target is not None:
                draw(target - trainable - len(running))
    except BaseException:
        for task in started:
            task.cancel()
        await asyncio.gather(*started, return_exceptions=True)
        raise
    finally:
        current_observer.reset(token)
        progress.close()
    gathered = _gathered([task.result() for task in started])
    gathered.counts = signal.take_step_metrics()
    return gathered


def _gathered(results: list[Any]) -> GatheredGroups:
    """The kept groups of the gather's results in order; the others counted as dropped."""
    kept = GatheredGroups(
        group for result in results if isinstance(result, list) for group in result
    )
    kept.dropped = sum(1 for result in results if not isinstance(result, list))
    return kept


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory] | Awaitable[Iterable[Trajectory]]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
    show_progress: bool = True,
) -> list[Any]:
    """Run rollouts concurrently; their results in order, as ART returns them.

    Each result is a Trajectory, or a list of them when the awaitable returns several. A
    rollout that raised within `max_exceptions` is returned in its place as the exception
    itself; past the limit the gather raises `TooManyExceptionsError`.
    """
    if pbar_total_completion_tokens:
        warnings.warn(
            "pbar_total_completion_tokens is deprecated (as in ART) and ignored",
            DeprecationWarning,
            stacklevel=2,
        )
    awaitables = list(trajectories)
    progress = _Progress(len(awaitables), pbar_desc, max_exceptions, show_progress)

    async def one(awaitable: Awaitable[Any]) -> Any:
        try:
            result = await awaitable
            if isinstance(result, Trajectory):
                progress.done(result)
                return result
            if isinstance(result, str | bytes) or not isinstance(result, Iterable):
                raise TypeError(
                    "a rollout must return an art.Trajectory or a list of them, got "
                    f"{type(result).__name__}"
                )
            several = list(result)
            for trajectory in several:
                if not isinstance(trajectory, Trajectory):
                    raise TypeError(
                        f"a rollout returned a list holding a {type(trajectory).__name__}, "
                        "not an art.Trajectory"
                    )
                progress._record(trajectory)
            progress._show()
            progress.bar.update(1)
            return several
        except asyncio.CancelledError as error:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            progress.done(RolloutException.from_exception(error), error)
            return error
        except TooManyExceptionsError:
            raise
        except Exception as error:  # noqa: BLE001 - returned in its place, as ART does
            progress.done(RolloutException.from_exception(error), error)
            return error

    try:
        return await gather_or_cancel([one(awaitable) for awaitable in awaitables])
    finally:
        progress.close()
