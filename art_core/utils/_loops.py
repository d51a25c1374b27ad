"""Small helpers for training loops, as ART's `art.utils`: deterministic dataset batches,
retrying flaky calls, and limiting how many calls run at once.

`iterate_dataset` shuffles each epoch with `random.Random(seed + epoch)`; the default seed 0
gives ART's order (`random.Random(epoch)`) exactly, so a ported run sees the same batches.
Where ART would fail obscurely (groups_per_step=0 divides by zero) a ValueError says why.

Ours, not ART's: `iterate_dataset(..., signal=art.GroupSignal(...))` skips scenarios whose recent
groups were all-equal and lets `gather_trajectory_groups(batch.groups(make_group))` draw more
scenarios while too few groups carry signal (see `art_core.utils._signal`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from art_core.trajectories import TrajectoryGroup
    from art_core.utils._signal import GroupSignal

logger = logging.getLogger("art_core")

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class DatasetBatch(Generic[T]):
    """The items of one training step, with where it sits in the run."""

    items: list[T]
    step: int  # global step index, counting from 0
    epoch: int
    epoch_step: int
    signal: GroupSignal | None = field(default=None, repr=False, compare=False)
    # The dataset's next unskipped item (None once it ran out): dynamic sampling draws from it.
    draw: Callable[[], tuple[T] | None] | None = field(default=None, repr=False, compare=False)

    def groups(
        self, make_group: Callable[[T], TrajectoryGroup | Awaitable[TrajectoryGroup]]
    ) -> BatchGroups[T]:
        """The batch's groups, `make_group(item)` each, for `gather_trajectory_groups`.

        With a `signal` the gather records each group against its item and, while too few
        carry signal, draws more items from the dataset (`GroupSignal(min_trainable_groups=)`).
        Without one it is the same as `(make_group(item) for item in batch.items)`.
        """
        return BatchGroups(self, make_group)


class BatchGroups(Generic[T]):
    """`DatasetBatch.groups(make_group)`: what `gather_trajectory_groups` needs to record and
    top up a step's groups; iterating it yields `make_group(item)` for the batch's items."""

    def __init__(
        self,
        batch: DatasetBatch[T],
        make_group: Callable[[T], TrajectoryGroup | Awaitable[TrajectoryGroup]],
    ) -> None:
        if not callable(make_group):
            raise TypeError(
                "batch.groups(make_group): make_group must be a function of one item returning "
                f"an art.TrajectoryGroup (or an awaitable of one), got {type(make_group).__name__}"
            )
        self.batch = batch
        self.make_group = make_group

    def __iter__(self) -> Iterator[TrajectoryGroup | Awaitable[TrajectoryGroup]]:
        return (self.make_group(item) for item in self.batch.items)


def iterate_dataset(
    dataset: Sequence[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    use_tqdm: bool = True,
    *,
    seed: int = 0,
    signal: GroupSignal | None = None,
) -> Iterator[DatasetBatch[T]]:
    """Batches of `groups_per_step` items per step, reshuffled each epoch with a fixed seed.

    Resumable: `initial_step=model_step` skips the steps already trained and yields exactly what
    an uninterrupted run would have yielded from there. A last partial batch is kept.

    `signal=art.GroupSignal(...)`: items whose recent groups were all-equal are passed over (each
    batch still holds `groups_per_step` items, drawn further along the order), and the batch's
    `groups(make_group)` can draw more. Resuming then skips `initial_step x groups_per_step`
    items of the order: the signal's memory of a previous process is not kept.
    """
    if groups_per_step < 1 or num_epochs < 1 or initial_step < 0:
        raise ValueError("groups_per_step and num_epochs must be >= 1 and initial_step >= 0")
    if not dataset:
        return
    if signal is not None:
        yield from _signal_batches(
            dataset, groups_per_step, num_epochs, initial_step, use_tqdm, seed, signal
        )
        return
    steps_per_epoch = -(-len(dataset) // groups_per_step)
    total = steps_per_epoch * num_epochs
    bar = tqdm(
        total=total,
        initial=min(initial_step, total),
        desc="Iterating dataset",
        unit="batch",
        disable=not use_tqdm,
    )
    try:
        for epoch in range(num_epochs):
            order = _shuffled(len(dataset), seed + epoch)
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                chunk = order[epoch_step * groups_per_step : (epoch_step + 1) * groups_per_step]
                yield DatasetBatch([dataset[i] for i in chunk], step, epoch, epoch_step)
                bar.update(1)
    finally:
        bar.close()


def _signal_batches(
    dataset: Sequence[T],
    groups_per_step: int,
    num_epochs: int,
    initial_step: int,
    use_tqdm: bool,
    seed: int,
    signal: GroupSignal,
) -> Iterator[DatasetBatch[T]]:
    """`iterate_dataset` with a GroupSignal: the same order, settled items passed over."""
    order = (
        (epoch, dataset[i])
        for epoch in range(num_epochs)
        for i in _shuffled(len(dataset), seed + epoch)
    )
    for _ in range(initial_step * groups_per_step):
        if next(order, None) is None:
            return
    where = {"epoch": 0}

    def draw() -> tuple[T] | None:
        for epoch, item in order:
            if not signal.skip(item):
                where["epoch"] = epoch
                return (item,)
        return None

    steps_per_epoch = -(-len(dataset) // groups_per_step)
    bar = tqdm(total=steps_per_epoch * num_epochs, initial=initial_step, desc="Iterating dataset",
               unit="batch", disable=not use_tqdm)  # fmt: skip
    step, epoch_start = initial_step, {0: initial_step}
    try:
        while True:
            items: list[T] = []
            while len(items) < groups_per_step and (drawn := draw()) is not None:
                items.append(drawn[0])
            if not items:
                return
            epoch = where["epoch"]
            first = epoch_start.setdefault(epoch, step)
            yield DatasetBatch(items, step, epoch, step - first, signal=signal, draw=draw)
            step += 1
            bar.update(1)
    finally:
        bar.close()


def _shuffled(count: int, seed: int) -> list[int]:
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


def retry(
    max_attempts: int = 3,
    delay: float = 0.25,
    backoff_factor: float = 2.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
    on_retry: Callable[[Exception, int], None] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function, sync or async: retry on `exceptions`, waiting delay,
    delay*backoff_factor, ...; the last failure is raised.

    Before each wait `on_retry(error, attempt)` is called (attempt counts from 1), or else a
    warning is logged: ART's signature and defaults.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")

    def before_retry(function: Callable[..., Any], error: Exception, attempt: int) -> None:
        if on_retry is not None:
            on_retry(error, attempt)
        else:
            logger.warning(
                "Retry %d/%d for %s after error: %s",
                attempt, max_attempts, getattr(function, "__name__", function), error,
            )  # fmt: skip

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                wait = delay
                for attempt in range(1, max_attempts + 1):
                    try:
                        return await function(*args, **kwargs)  # type: ignore[misc]
                    except exceptions as error:
                        if attempt == max_attempts or not isinstance(error, Exception):
                            raise
                        before_retry(function, error, attempt)
                        await asyncio.sleep(wait)
                        wait *= backoff_factor
                raise AssertionError("unreachable")

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(function)
        def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            wait = delay
            for attempt in range(1, max_attempts + 1):
                try:
                    return function(*args, **kwargs)
                except exceptions as error:
                    if attempt == max_attempts or not isinstance(error, Exception):
                        raise
                    before_retry(function, error, attempt)
                    time.sleep(wait)
                    wait *= backoff_factor
            raise AssertionError("unreachable")

        return sync_wrapper

    return decorate


def limit_concurrency(
    n: int, derive_key: Callable[..., str] | None = None
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorate an async function: at most `n` calls run at once, per key when `derive_key(*args,
    **kwargs)` names one (one limit for all calls otherwise), as ART's `limit_concurrency`."""
    if n < 1:
        raise ValueError(f"limit_concurrency needs n >= 1, got {n}")
    semaphores: dict[str, asyncio.Semaphore] = {}

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            key = derive_key(*args, **kwargs) if derive_key is not None else "default"
            semaphore = semaphores.setdefault(key, asyncio.Semaphore(n))
            async with semaphore:
                return await function(*args, **kwargs)

        return wrapper

    return decorate
