"""Adapter leases (ART's `art.adapter_leases`, in 0.5.23): pin a rollout to one step's adapter.

A pin is a context variable (model name -> `InferenceTarget`), so each asyncio task keeps its
own: two rollouts running side by side may be pinned to different steps, and a nested pin
restores the outer one on exit. `TrainableModel.get_inference_name()` consults it, so a rollout
that began on step N keeps asking for `<name>@N` while training moves on.

`AdapterLeaseManager` counts the leases held on each step; a backend keeps (does not delete)
every step with a lease (`RemoteBackend.adapter_lease`). ART keeps it at
`art.local.adapter_leases`, which imports it from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AdapterLeaseManager",
    "InferenceTarget",
    "pin_inference_step",
    "pin_inference_target",
    "pinned_inference_name",
    "pinned_inference_step",
]


class InferenceTarget(BaseModel):
    """Where a pinned model's inference goes: `step`, and the served name to ask for (None: the
    backend's own name for that step)."""

    model_config = ConfigDict(frozen=True)

    step: int
    model_name: str | None = None


# A fresh mapping on every pin (never mutated), so a pin made in one task is invisible to others.
_pins: ContextVar[Mapping[str, InferenceTarget]] = ContextVar(
    "art_core_inference_pins", default=MappingProxyType({})
)


def pinned_inference_step(model_name: str) -> int | None:
    """The step `model_name` is pinned to in this context, or None."""
    target = _pins.get().get(model_name)
    return None if target is None else target.step


def pinned_inference_name(model_name: str, step: int | None = None) -> str | None:
    """The served name the pin of `model_name` names, or None: no pin, a pin without a name,
    or `step` given and not the pinned one."""
    target = _pins.get().get(model_name)
    if target is None or (step is not None and step != target.step):
        return None
    return target.model_name


@asynccontextmanager
async def pin_inference_step(model_name: str, step: int) -> AsyncIterator[None]:
    """Inside the block, `model_name`'s inference goes to `step`."""
    async with pin_inference_target(model_name, step=step):
        yield


@asynccontextmanager
async def pin_inference_target(
    model_name: str, *, step: int, inference_name: str | None = None
) -> AsyncIterator[None]:
    """Inside the block, `model_name`'s inference goes to `step`, asked for as
    `inference_name` when given; the pin it replaced comes back on exit."""
    token = _pins.set(
        {**_pins.get(), model_name: InferenceTarget(step=step, model_name=inference_name)}
    )
    try:
        yield
    finally:
        _pins.reset(token)


class AdapterLeaseManager:
    """How many leases hold each step; a step with one is kept by the backend that owns this."""

    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()

    @asynccontextmanager
    async def lease(self, step: int) -> AsyncIterator[None]:
        """Hold `step` for the block (leases nest and overlap: each one counts)."""
        # No lock: the count changes without an await, so no other task sees it half-done.
        self._counts[step] += 1
        try:
            yield
        finally:
            self._counts[step] -= 1
            if self._counts[step] <= 0:
                del self._counts[step]

    def active_steps(self) -> set[int]:
        """The steps at least one lease holds now."""
        return set(self._counts)
