"""Batches of groups as they finish: `async for batch in art.trajectory_group_batches(...)`.

ART's `trajectory_group_batches`: up to `batch_size * max_concurrent_batches` groups run at
once; a batch of `batch_size` groups is yielded as soon as that many have finished (in the order
they finished), and the last, smaller batch at the end. `skip_batches` skips the first groups
without running them (resuming a run).

Exceptions count per batch: the rollouts that raised in the batch's groups, plus one for each
group whose own awaitable raised (that group is left out, as in ART). Past `max_batch_exceptions`
(a count, checked as groups finish, or a fraction of the batch's rollouts when below 1, checked
when the batch is complete) it raises `TooManyExceptionsError`.
Two differences from ART, on purpose: ART compares a fraction with the batch size in groups,
not rollouts, and after its first batch it resets the limit to 0 (a slip: later batches raise
on their first exception); here every batch gets the limit given.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import warnings
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any

from tqdm.auto import tqdm

from art_core.errors import TooManyExceptionsError
from art_core.trajectories import (
    RolloutException,
    Trajectory,
    TrajectoryGroup,
    current_observer,
)

__all__ = ["trajectory_group_batches"]

logger = logging.getLogger("art_core.gather")


class _KeepExceptions:
    """The observer of the running groups: every rollout exception stays on its group; the
    limit is checked per batch, when the group finishes."""

    def started(self, group: TrajectoryGroup, count: int) -> None:
        pass

    def done(self, outcome: Trajectory | RolloutException, error: BaseException | None) -> None:
        pass


class _GroupFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


async def _run(item: Any) -> TrajectoryGroup | _GroupFailed:
    current_observer.set(_KeepExceptions())
    try:
        group = await item
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"expected art.TrajectoryGroup, got {type(group).__name__}")
        return await group  # a group returned with its rollouts still pending
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        return _GroupFailed(error)
    except Exception as error:  # noqa: BLE001 - a failed group is counted, as ART does
        return _GroupFailed(error)


def _skip(item: Any) -> None:
    """Close what a skipped item would have run, so no 'never awaited' warning is left."""
    pending = item._pending if isinstance(item, TrajectoryGroup) else [item]
    for awaitable in pending:
        if inspect.iscoroutine(awaitable):
            awaitable.close()


async def trajectory_group_batches(
    groups: Iterable[TrajectoryGroup | Awaitable[TrajectoryGroup]],
    *,
    batch_size: int,
    max_batch_exceptions: int | float = 0,
    max_concurrent_batches: int = 4,
    skip_batches: int = 0,
    pbar_desc: str | None = "batches",
    pbar_total_completion_tokens: bool = False,
) -> AsyncIterator[list[TrajectoryGroup]]:
    """Yield lists of `batch_size` finished groups as they complete (see the module docstring)."""
    if pbar_total_completion_tokens:
        warnings.warn(
            "pbar_total_completion_tokens is deprecated (as in ART) and ignored",
            DeprecationWarning,
            stacklevel=2,
        )
    if batch_size < 1 or max_concurrent_batches < 1 or skip_batches < 0:
        raise ValueError("batch_size and max_concurrent_batches must be >= 1, skip_batches >= 0")
    if max_batch_exceptions < 0:
        raise ValueError(f"max_batch_exceptions must be >= 0, got {max_batch_exceptions}")
    items = list(groups)
    for item in items[: batch_size * skip_batches]:
        _skip(item)
    unstarted = items[batch_size * skip_batches :]
    unstarted.reverse()  # pop() from the end takes them in order
    running: set[asyncio.Task[TrajectoryGroup | _GroupFailed]] = set()
    batch: list[TrajectoryGroup] = []
    order: dict[asyncio.Task[TrajectoryGroup | _GroupFailed], int] = {}
    failures: list[RolloutException] = []
    rollouts = 0
    bar = tqdm(total=batch_size, desc=pbar_desc, disable=not pbar_desc)
    try:
        while unstarted or running:
            while unstarted and len(running) < batch_size * max_concurrent_batches:
                task = asyncio.ensure_future(_run(unstarted.pop()))
                order[task] = len(order)
                running.add(task)
            if running and len(batch) < batch_size:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=order.__getitem__):  # finished together: as given
                    outcome = task.result()
                    if isinstance(outcome, _GroupFailed):
                        failures.append(RolloutException.from_exception(outcome.error))
                        rollouts += 1
                        logger.warning(
                            "a group's rollout raised %s: %s; group left out",
                            type(outcome.error).__name__,
                            outcome.error,
                        )
                    else:
                        batch.append(outcome)
                        failures += outcome.exceptions
                        rollouts += len(outcome.trajectories) + len(outcome.exceptions)
                    bar.update(1)
                _check(failures, rollouts, max_batch_exceptions, final=False)
            while len(batch) >= batch_size:
                _check(failures, rollouts, max_batch_exceptions, final=True)
                yield batch[:batch_size]
                batch = batch[batch_size:]
                failures, rollouts = [], 0
                bar.reset()
        if batch:
            _check(failures, rollouts, max_batch_exceptions, final=True)
            yield batch
    finally:
        bar.close()
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def _check(
    failures: list[RolloutException], rollouts: int, limit: int | float, *, final: bool
) -> None:
    fraction = isinstance(limit, float) and limit < 1
    if fraction and not final:
        return  # a fraction is of the whole batch's rollouts, known when it is complete
    allowed = math.floor(limit * rollouts) if fraction else int(limit)
    if len(failures) > allowed:
        raise TooManyExceptionsError(
            f"{len(failures)} of {rollouts} rollouts in this batch raised, more than "
            f"max_batch_exceptions allows ({allowed}).",
            first_traceback=failures[0].traceback,
        )
