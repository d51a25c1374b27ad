"""Training's model work runs one call at a time, each on a thread that is gone afterwards.

A long-lived trainer thread keeps an OpenMP worker pool, which turns every OpenMP wait in the
process from spinning to sleeping (_trainer_thread.py; measured in BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from art_backend.training._trainer_thread import TrainerThread


def test_each_call_runs_on_its_own_thread_which_has_exited_when_the_call_returns():
    runner = TrainerThread()

    async def main() -> list[threading.Thread]:
        return [await runner.run(threading.current_thread) for _ in range(3)]

    threads = asyncio.run(main())
    assert len({id(thread) for thread in threads}) == 3
    assert all(thread is not threading.main_thread() for thread in threads)
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()


def test_calls_are_serialised_and_errors_reach_the_caller():
    runner = TrainerThread()
    running = 0
    most = 0

    def work(value: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        time.sleep(0.05)
        running -= 1
        return value * 2

    def fail() -> None:
        raise ValueError("bad rows")

    async def main() -> list[int]:
        results = await asyncio.gather(*(runner.run(work, n) for n in range(4)))
        with pytest.raises(ValueError, match="bad rows"):
            await runner.run(fail)
        return list(results)

    assert asyncio.run(main()) == [0, 2, 4, 6]
    assert most == 1
