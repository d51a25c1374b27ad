"""The rollout worker: a long-lived async Ray actor that runs many rollouts at once.

One actor holds one event loop; each `run` call is a coroutine on it, so a worker runs as many
rollouts concurrently as its `max_concurrency` allows (measured: +5 ms per call next to plain
asyncio, where a Ray task per rollout costs a CPU slot and a new event loop each). The rollout
function, the model (pickled to a detached copy: see `art_core.model.TrainableModel.__getstate__`)
and the scenario arrive with the call; the Trajectory (or TrajectoryGroup) goes back to the caller.

What a rollout may not do to its worker:
- raise a `BaseException` that is not an `Exception` (`SystemExit`, `KeyboardInterrupt`): out of
  a Task it would stop the actor's event loop for good. It is caught and raised as
  `RolloutExitError`, the rollout's own failure, in the call and in every task the rollout
  creates (the loop's task factory guards them).
- block the loop: a plain `def` rollout runs on a thread (`asyncio.to_thread`), so its
  `time.sleep` or CPU work leaves the loop free. An `async def` rollout that blocks (a sync call
  without `await`) cannot be moved; `health`, which answers on a loop of its own (the
  `art_health` concurrency group), tells the executor which call holds the loop, and the executor
  fails that call and replaces the worker.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
from collections.abc import Awaitable, Coroutine
from contextvars import ContextVar
from typing import Any

import ray

from art_core.trajectories import (
    RolloutException,
    Trajectory,
    TrajectoryGroup,
    current_observer,
)
from art_ray._errors import RolloutExitError

# The concurrency group whose loop answers `health` and `where` while the rollouts' loop is busy.
HEALTH_GROUP = "art_health"


class _KeepExceptions:
    """Keeps a group's failed rollouts on the group (the driver's gather counts them)."""

    def started(self, group: TrajectoryGroup, count: int) -> None:
        pass

    def done(self, outcome: Trajectory | RolloutException, error: BaseException | None) -> None:
        pass


# The call whose code runs: set by `run`, inherited by the tasks a rollout creates.
_CALL: ContextVar[int | None] = ContextVar("art_ray_call", default=None)


async def _guarded(call_id: int | None, awaitable: Awaitable[Any]) -> Any:
    """`await awaitable` as part of call `call_id` (`health` finds this frame on a blocked
    loop's stack), a BaseException that would stop the loop turned into `RolloutExitError`."""
    try:
        return await awaitable
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as error:  # noqa: BLE001 - SystemExit would end the actor's loop
        raise _exit_error(error) from None


def _guarded_task(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, Any], **options: Any
) -> asyncio.Task[Any]:
    """The worker loop's task factory: a task a rollout creates (`create_task`, `gather`) is
    guarded as its call is, so its SystemExit cannot stop the loop either."""
    return asyncio.Task(_guarded(_CALL.get(), coroutine), loop=loop, **options)


def _sync_call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)` on a worker thread, a BaseException raised as `RolloutExitError`
    (the thread pool would hand it to the loop as it is)."""
    try:
        return fn(*args, **kwargs)
    except Exception:
        raise
    except BaseException as error:  # noqa: BLE001 - SystemExit would end the actor's loop
        raise _exit_error(error) from None


def _exit_error(error: BaseException) -> RolloutExitError:
    arguments = ", ".join(repr(argument) for argument in error.args)
    return RolloutExitError(
        f"the rollout raised {type(error).__name__}({arguments}); a rollout's SystemExit or "
        "KeyboardInterrupt ends that rollout, not its Ray worker",
        type(error).__name__,
    )


class RolloutWorker:
    """Runs rollout functions on its node; wrapped by `ray.remote` when the executor starts it."""

    def __init__(self) -> None:
        context = ray.get_runtime_context()
        self._where = {"node_id": context.get_node_id(), "pid": os.getpid()}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    @ray.method(concurrency_group=HEALTH_GROUP)
    def where(self) -> dict[str, Any]:
        """The node this worker runs on and its process id."""
        return self._where

    async def run(
        self, call_id: int, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """`await fn(*args, **kwargs)` (a plain `def` on a thread); a returned group's pending
        rollouts are run here too."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            self._loop.set_task_factory(_guarded_task)  # type: ignore[arg-type]
        _CALL.set(call_id)  # this call's own context: Ray runs each call as a task
        if inspect.iscoroutinefunction(fn):
            result = await _guarded(call_id, fn(*args, **kwargs))
        else:
            result = await _guarded(call_id, asyncio.to_thread(_sync_call, fn, args, kwargs))
            if inspect.isawaitable(result):
                result = await _guarded(call_id, result)
        if isinstance(result, TrajectoryGroup) and result._pending:
            token = current_observer.set(_KeepExceptions())
            try:
                await _guarded(call_id, result)
            finally:
                current_observer.reset(token)
        return result

    @ray.method(concurrency_group=HEALTH_GROUP)
    async def health(self, patience: float) -> dict[str, Any]:
        """Whether the rollouts' loop runs a callback within `patience` seconds; if not, the id
        of the call whose code holds it (None: none of ours, or the loop has stopped)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return {"answers": loop is None, "blocking": None}
        answered = threading.Event()
        loop.call_soon_threadsafe(answered.set)
        if await asyncio.to_thread(answered.wait, patience):
            return {"answers": True, "blocking": None}
        return {"answers": False, "blocking": self._blocking_call()}

    def _blocking_call(self) -> int | None:
        frame = sys._current_frames().get(self._loop_thread or -1)
        while frame is not None:
            if frame.f_code is _guarded.__code__ and frame.f_locals.get("call_id") is not None:
                return frame.f_locals["call_id"]
            frame = frame.f_back
        return None
