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
from typing import Any, overload

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


RolloutFunction = Callable[..., Awaitable[Any]]
WrappedRollout = Callable[..., Awaitable[art.Trajectory]]


@overload
def wrap_rollout(model: art.TrainableModel, fn: RolloutFunction) -> WrappedRollout: ...
@overload
def wrap_rollout(
    model: art.TrainableModel, fn: None = None
) -> Callable[[RolloutFunction], WrappedRollout]: ...
def wrap_rollout(
    model: art.TrainableModel, fn: RolloutFunction | None = None
) -> WrappedRollout | Callable[[RolloutFunction], WrappedRollout]:
    """`fn` run as one rollout; the wrapped function returns its trajectory.

    `fn` may return (ART's contract) its `art.Trajectory`, or a subclass with fields of its own:
    it keeps its reward, metrics, metadata and fields, and gets the captured conversation(s).
    Or it returns the reward (a number), or None after setting `current_rollout().reward`.
    `wrap_rollout(model)` without `fn` is a decorator.
    """
    if fn is None:
        return functools.partial(wrap_rollout, model)
    rollout_fn = fn

    @functools.wraps(rollout_fn)
    async def wrapped(*args: Any, **kwargs: Any) -> art.Trajectory:
        async with rollout(model) as capture:
            result = await rollout_fn(*args, **kwargs)
            if isinstance(result, int | float) and not isinstance(result, bool):
                capture.reward = float(result)
            elif result is not None and not isinstance(result, art.Trajectory):
                raise TypeError(
                    f"{getattr(rollout_fn, '__name__', 'the rollout')} returned "
                    f"{type(result).__name__}: return its art.Trajectory, the reward (a number), "
                    "or None after setting current_rollout().reward"
                )
        if isinstance(result, art.Trajectory):
            return _with_captured_calls(result, capture.trajectory)
        return capture.trajectory

    return wrapped


def _with_captured_calls(returned: art.Trajectory, captured: art.Trajectory) -> art.Trajectory:
    """The rollout's own trajectory, given the conversations the rollout's calls recorded.

    As in ART, recorded calls replace the returned conversation (a rollout built on
    `init_chat_model` returns an empty one); without recorded calls it is kept as returned.
    Metadata and metrics merge, the rollout's own values winning.
    """
    if captured.messages_and_choices or captured.additional_histories:
        returned.messages_and_choices = captured.messages_and_choices
        returned.tools = captured.tools
        returned.additional_histories = captured.additional_histories
    returned.metadata = {**captured.metadata, **returned.metadata}
    returned.metrics = {**captured.metrics, **returned.metrics}
    return returned
