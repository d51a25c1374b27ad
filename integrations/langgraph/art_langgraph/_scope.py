"""The current rollout, carried by a contextvar: every chat model call inside the scope records
its exact tokens into this rollout, whatever task, thread or subgraph it runs in.

LangGraph runs parallel branches as asyncio tasks and sync nodes in executor threads, both with a
copy of the caller's context, so a call made anywhere inside one rollout's graph run sees that
rollout, and concurrent rollouts never see each other's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import art_core as art
from art_core import RolloutCapture

_current: ContextVar[RolloutCapture | None] = ContextVar("art_langgraph_rollout", default=None)


class NoRolloutError(art.ArtError):
    """A trainable chat model was asked for outside any rollout and without a model."""


def current_rollout() -> RolloutCapture | None:
    """The rollout the calling code runs in, or None outside `art_langgraph.rollout(...)`."""
    return _current.get()


@contextlib.asynccontextmanager
async def rollout(model: art.TrainableModel, scenario: Any = None) -> AsyncIterator[RolloutCapture]:
    """Scope one graph run: calls made inside are recorded; afterwards `r.trajectory`.

    `scenario` is kept in the trajectory's metadata. Set `r.reward` (and `r.metrics`) inside.
    """
    async with model.rollout() as capture:
        if scenario is not None:
            capture.metadata["scenario"] = (
                scenario.model_dump() if hasattr(scenario, "model_dump") else scenario
            )
        token = _current.set(capture)
        try:
            yield capture
        finally:
            _current.reset(token)


def wrap_rollout(
    model: art.TrainableModel, fn: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[art.Trajectory]]:
    """`fn` run as one rollout; returns its trajectory.

    `fn` may return the reward (a number), or None after setting `current_rollout().reward`.
    """

    @functools.wraps(fn)
    async def wrapped(*args: Any, **kwargs: Any) -> art.Trajectory:
        async with rollout(model) as capture:
            result = await fn(*args, **kwargs)
            if isinstance(result, int | float) and not isinstance(result, bool):
                capture.reward = float(result)
            elif result is not None:
                raise TypeError(
                    f"{getattr(fn, '__name__', 'the rollout')} returned {type(result).__name__}: "
                    "return the reward (a number) or None after setting current_rollout().reward"
                )
        return capture.trajectory

    return wrapped
