"""The rollout worker: a long-lived async Ray actor that runs many rollouts at once.

One actor holds one event loop; each `run` call is a coroutine on it, so a worker runs as many
rollouts concurrently as its `max_concurrency` allows (measured: +5 ms per call next to plain
asyncio, where a Ray task per rollout costs a CPU slot and a new event loop each). The rollout
function, the model (pickled to a detached copy: see `art_core.model.TrainableModel.__getstate__`)
and the scenario arrive with the call; the Trajectory (or TrajectoryGroup) goes back to the caller.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from art_core.trajectories import (
    RolloutException,
    Trajectory,
    TrajectoryGroup,
    current_observer,
)


class _KeepExceptions:
    """Keeps a group's failed rollouts on the group (the driver's gather counts them)."""

    def started(self, group: TrajectoryGroup, count: int) -> None:
        pass

    def done(self, outcome: Trajectory | RolloutException, error: BaseException | None) -> None:
        pass


class RolloutWorker:
    """Runs rollout functions on its node; wrapped by `ray.remote` when the executor starts it."""

    def __init__(self) -> None:
        import ray

        context = ray.get_runtime_context()
        self._where = {"node_id": context.get_node_id(), "pid": os.getpid()}

    def where(self) -> dict[str, Any]:
        """The node this worker runs on and its process id."""
        return self._where

    async def run(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`await fn(*args, **kwargs)`; a returned group's pending rollouts are run here too."""
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, TrajectoryGroup) and result._pending:
            token = current_observer.set(_KeepExceptions())
            try:
                await result
            finally:
                current_observer.reset(token)
        return result
