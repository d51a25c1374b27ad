"""The SDK's futures: every operation answers a request id at once; `retrieve_future` polls it.

An operation runs as a task on the server's loop (a client that goes away does not cancel it).
`retrieve_future` waits for it up to `LONG_POLL_SECONDS`, then answers `try_again` (the SDK
polls again, for as long as the operation takes: a slow step never times a future out). A
finished operation answers its result, JSON or protobuf (`Answer`); a failed one answers
`{"error", "category"}`, which the SDK raises as `RequestFailedError` (category "user" for a
4xx `BackendError`, "server" otherwise).

A training run's operations carry the SDK's `seq_id` (1, 2, 3 ... per training client): they
run in that order whatever order their requests arrive in (`RunOrder`), so a forward_backward
and the optim_step sent right after it never swap.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from art_backend._errors import BackendError

logger = logging.getLogger("art_backend.tinker")

LONG_POLL_SECONDS = 20.0  # under the SDK's 45 s timeout for one retrieve_future
KEPT_RESULTS = 10_000  # finished operations kept for retrieval, oldest forgotten first


@dataclass(frozen=True)
class Answer:
    """An operation's result: a JSON body, or protobuf bytes (forward_backward, asample)."""

    body: dict[str, Any] | None = None
    proto: bytes | None = None


class RunOrder:
    """Runs a training run's operations in `seq_id` order (1, 2, ...), one at a time."""

    def __init__(self) -> None:
        self.next_seq_id = 1
        self._changed = asyncio.Condition()

    async def run(self, seq_id: int | None, work: Callable[[], Awaitable[Answer]]) -> Answer:
        """`work()` once every lower seq_id has run (None, or one already passed: at once)."""
        if seq_id is None or seq_id < self.next_seq_id:
            return await work()
        async with self._changed:
            await self._changed.wait_for(lambda: self.next_seq_id == seq_id)
        try:
            return await work()
        finally:
            async with self._changed:
                self.next_seq_id = seq_id + 1
                self._changed.notify_all()


class Futures:
    """Operations by request id: started, then retrieved (their answers kept a while)."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Answer]] = {}

    def start(self, work: Awaitable[Answer]) -> str:
        """Run `work` as a task; its request id."""
        request_id = f"req-{uuid.uuid4().hex}"
        self._tasks[request_id] = asyncio.ensure_future(work)
        self._forget_oldest()
        return request_id

    async def retrieve(self, request_id: str) -> Answer | dict[str, Any] | None:
        """The answer, the failure body, or None while the operation still runs; KeyError for
        an id this server never gave (or forgot)."""
        task = self._tasks[request_id]
        if not task.done():
            await asyncio.wait({task}, timeout=LONG_POLL_SECONDS)
            if not task.done():
                return None
        error = task.exception()
        if error is None:
            return task.result()
        return failure_body(error)

    def _forget_oldest(self) -> None:
        if len(self._tasks) <= KEPT_RESULTS:
            return
        for request_id in [key for key, task in self._tasks.items() if task.done()]:
            del self._tasks[request_id]
            if len(self._tasks) <= KEPT_RESULTS:
                return


def failure_body(error: BaseException) -> dict[str, Any]:
    """What the SDK raises as `RequestFailedError`: our message, user or server at fault."""
    if isinstance(error, BackendError):
        category = "user" if 400 <= error.status_code < 500 else "server"
        return {"error": error.message, "category": category}
    logger.error("Tinker operation failed", exc_info=error)
    return {"error": f"{type(error).__name__}: {error}", "category": "server"}
