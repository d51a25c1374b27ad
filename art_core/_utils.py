"""Small helpers for training loops: deterministic dataset batches, and retrying flaky calls."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tqdm.auto import tqdm

logger = logging.getLogger("art_core")

T = TypeVar("T")


@dataclass(frozen=True)
class DatasetBatch(Generic[T]):
    """The items of one training step, with where it sits in the run."""

    items: list[T]
    step: int  # global step index, counting from 0
    epoch: int
    epoch_step: int


def iterate_dataset(
    dataset: Sequence[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    *,
    seed: int = 42,
    use_tqdm: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """Batches of `groups_per_step` items per step, reshuffled each epoch with a fixed seed.

    Resumable: `initial_step=model_step` skips the steps already trained and yields exactly what
    an uninterrupted run would have yielded from there. A last partial batch is kept.
    """
    if groups_per_step < 1 or num_epochs < 1 or initial_step < 0:
        raise ValueError("groups_per_step and num_epochs must be >= 1 and initial_step >= 0")
    steps_per_epoch = -(-len(dataset) // groups_per_step)
    total = steps_per_epoch * num_epochs
    bar = tqdm(total=total, initial=min(initial_step, total), desc="steps", disable=not use_tqdm)
    try:
        for epoch in range(num_epochs):
            order = list(range(len(dataset)))
            random.Random(seed + epoch).shuffle(order)
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                chunk = order[epoch_step * groups_per_step : (epoch_step + 1) * groups_per_step]
                yield DatasetBatch([dataset[i] for i in chunk], step, epoch, epoch_step)
                bar.update(1)
    finally:
        bar.close()


def retry(
    max_attempts: int = 3,
    *,
    delay: float = 0.5,
    backoff: float = 2.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Decorate an async function: retry on `exceptions`, waiting delay, delay*backoff, ..."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")

    def decorate(function: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            wait = delay
            for attempt in range(1, max_attempts + 1):
                try:
                    return await function(*args, **kwargs)
                except exceptions as error:
                    if attempt == max_attempts:
                        raise
                    logger.warning(
                        "%s failed (attempt %d/%d): %s; retrying in %.1fs",
                        function.__name__, attempt, max_attempts, error, wait,
                    )  # fmt: skip
                    await asyncio.sleep(wait)
                    wait *= backoff
            raise AssertionError("unreachable")

        return wrapper

    return decorate
