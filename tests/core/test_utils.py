"""iterate_dataset is deterministic and resumable; retry retries with backoff and then raises."""

from __future__ import annotations

import pytest

import art_core as art


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
