"""ART's art.utils: iterate_dataset (deterministic, resumable, ART's order), retry (sync and
async, on_retry, backoff_factor), limit_concurrency."""

from __future__ import annotations

import asyncio
import inspect
import random

import pytest

import art_core as art
from art_core.utils import _loops as art_utils


def batches(**kwargs) -> list[list[int]]:
    return [b.items for b in art.iterate_dataset(list(range(10)), use_tqdm=False, **kwargs)]


def test_iterate_dataset_shuffles_deterministically_per_epoch():
    run = batches(groups_per_step=4, num_epochs=2)
    assert run == batches(groups_per_step=4, num_epochs=2)
    assert [len(b) for b in run] == [4, 4, 2, 4, 4, 2]
    assert sorted(item for batch in run[:3] for item in batch) == list(
        range(10)
    )  # every item once per epoch
    assert run[:3] != run[3:]  # reshuffled in the second epoch


def test_iterate_dataset_resumes_exactly_where_it_left_off():
    full = batches(groups_per_step=3, num_epochs=2)
    assert batches(groups_per_step=3, num_epochs=2, initial_step=5) == full[5:]
    steps = [b.step for b in art.iterate_dataset(list(range(10)), 3, 2, 5, use_tqdm=False)]
    assert steps == list(range(5, 8))


async def test_retry_retries_then_succeeds_or_raises():
    calls = []

    @art.retry(max_attempts=3, delay=0.0, exceptions=(ConnectionError,))
    async def flaky(succeed_on: int) -> int:
        calls.append(1)
        if len(calls) < succeed_on:
            raise ConnectionError("down")
        return len(calls)

    assert await flaky(3) == 3
    calls.clear()
    with pytest.raises(ConnectionError):
        await flaky(5)
    assert len(calls) == 3


def test_iterate_dataset_gives_arts_order_and_takes_its_positional_arguments():
    # ART shuffles epoch e with random.Random(e); the default seed reproduces it exactly.
    order = list(range(10))
    random.Random(1).shuffle(order)
    run = list(art.iterate_dataset(list(range(10)), 5, 2, 0, False))
    assert run[2] == art.DatasetBatch(items=order[:5], step=2, epoch=1, epoch_step=0)
    assert [b.items for b in art.iterate_dataset([], 2, use_tqdm=False)] == []
    batch = run[0]
    batch.items = []  # a plain dataclass, as ART's
    with pytest.raises(ValueError, match="groups_per_step"):
        list(art.iterate_dataset([1], 0, use_tqdm=False))


def test_retry_calls_on_retry_and_backs_off_by_the_factor(monkeypatch: pytest.MonkeyPatch):
    waits: list[float] = []
    monkeypatch.setattr(art_utils.time, "sleep", waits.append)
    seen: list[tuple[str, int]] = []

    @art.retry(
        4, 0.5, 3.0, (ValueError,), lambda error, attempt: seen.append((str(error), attempt))
    )
    def sync_flaky() -> str:
        if len(seen) < 3:
            raise ValueError(f"bad {len(seen)}")
        return "ok"

    assert sync_flaky() == "ok"
    assert seen == [("bad 0", 1), ("bad 1", 2), ("bad 2", 3)]
    assert waits == [0.5, 1.5, 4.5]


def test_retry_does_not_retry_other_exceptions_and_keeps_arts_defaults():
    calls = []

    @art.retry(exceptions=(ValueError,))
    def wrong() -> None:
        calls.append(1)
        raise KeyError("not retried")

    with pytest.raises(KeyError):
        wrong()
    assert calls == [1]
    defaults = inspect.signature(art.retry).parameters
    assert [(name, p.default) for name, p in defaults.items()] == [
        ("max_attempts", 3), ("delay", 0.25), ("backoff_factor", 2.0),
        ("exceptions", (Exception,)), ("on_retry", None),
    ]  # fmt: skip


async def test_limit_concurrency_bounds_the_calls_at_once_per_key():
    running: dict[str, int] = {"a": 0, "b": 0}
    peak: dict[str, int] = {"a": 0, "b": 0}

    @art.limit_concurrency(2, derive_key=lambda key, _: key)
    async def work(key: str, index: int) -> int:
        running[key] += 1
        peak[key] = max(peak[key], running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1
        return index

    results = await asyncio.gather(*(work(k, i) for i in range(6) for k in "ab"))
    assert sorted(results) == sorted(list(range(6)) * 2)
    assert peak == {"a": 2, "b": 2}  # two at once for each key, never more
