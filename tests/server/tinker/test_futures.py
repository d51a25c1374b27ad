"""The Tinker API's futures and run order, without a server: operations answer through request
ids, a slow one answers `try_again` until it is done, and a run's operations run in seq_id order
whatever order they arrive in."""

from __future__ import annotations

import asyncio

import pytest

from art_backend._errors import InvalidRequestError
from art_backend.tinker import _futures
from art_backend.tinker._futures import Answer, Futures, RunOrder


async def test_a_slow_operation_answers_try_again_until_it_is_done(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(_futures, "LONG_POLL_SECONDS", 0.01)
    release = asyncio.Event()

    async def slow() -> Answer:
        await release.wait()
        return Answer({"done": True})

    futures = Futures()
    request_id = futures.start(slow())
    assert await futures.retrieve(request_id) is None  # the route answers try_again
    release.set()
    await asyncio.sleep(0)
    assert await futures.retrieve(request_id) == Answer({"done": True})
    assert await futures.retrieve(request_id) == Answer({"done": True})  # kept for a retry
    with pytest.raises(KeyError):
        await futures.retrieve("req-never-given")


async def test_a_failed_operation_answers_its_message_and_who_is_at_fault():
    async def refused() -> Answer:
        raise InvalidRequestError("tokens outside the vocabulary")

    async def broken() -> Answer:
        raise RuntimeError("disk full")

    futures = Futures()
    user, server = futures.start(refused()), futures.start(broken())
    assert await futures.retrieve(user) == {
        "error": "tokens outside the vocabulary",
        "category": "user",
    }
    assert await futures.retrieve(server) == {
        "error": "RuntimeError: disk full",
        "category": "server",
    }


async def test_a_runs_operations_run_in_seq_id_order_whatever_order_they_arrive_in():
    order, ran = RunOrder(), []

    def operation(seq_id: int):
        async def work() -> Answer:
            ran.append(seq_id)
            await asyncio.sleep(0)
            return Answer({"seq_id": seq_id})

        return order.run(seq_id, work)

    # optim_step (2) and save (3) arrive before the forward_backward (1) they follow.
    later = [asyncio.ensure_future(operation(3)), asyncio.ensure_future(operation(2))]
    await asyncio.sleep(0.01)
    assert ran == []
    answers = await asyncio.gather(operation(1), *later)
    assert ran == [1, 2, 3]
    assert [answer.body for answer in answers] == [{"seq_id": 1}, {"seq_id": 3}, {"seq_id": 2}]
    assert order.next_seq_id == 4
