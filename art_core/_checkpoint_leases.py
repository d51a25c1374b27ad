"""A backend's adapter leases: while one holds step N of a model, that model's inference is
pinned to `<name>@N` (in the holder's context) and N's checkpoint is never deleted through
this backend.

A lease is held on the server too (`POST .../holds`, given back when the block ends): a held
step stays served as `<name>@<N>` however many steps training moves on (beyond the served
window, `model.register(..., served_steps=...)`), and no deletion by any client removes its
checkpoint. The leases are also counted in this client (one `AdapterLeaseManager` per model),
and every deletion request this backend sends carries them as its `keep` list
(`art_core.wire.DeleteCheckpointsRequest`): ART's form (latest and best) keeps them, and the
`steps` form skips a leased step, naming it in the answer's `held` (a retention strategy's sweep
goes on; the step is offered again once its lease ends). A server that restarts forgets its
holds (the client's `keep` lists still protect the checkpoints from this backend's deletions).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from art_core.adapter_leases import AdapterLeaseManager, pin_inference_target
from art_core.errors import ArtError, UnsupportedOptionError

__all__ = ["CheckpointLeases"]

logger = logging.getLogger("art_core.leases")


class _Model(Protocol):
    project: str
    name: str


class CheckpointLeases:
    """RemoteBackend's lease calls (ART's `backend.adapter_lease` / `exact_adapter_lease`)."""

    if TYPE_CHECKING:

        async def checkpoint_steps(self, model: Any) -> list[int]: ...
        async def _request(self, method: str, path: str, body: Any = None) -> Any: ...
        def _model_path(self, model: Any) -> str: ...

    @property
    def _lease_managers(self) -> dict[tuple[str, str], AdapterLeaseManager]:
        # Made on first use, so that the backends' constructors need not know of leases.
        managers: dict[tuple[str, str], AdapterLeaseManager]
        managers = self.__dict__.setdefault("_adapter_lease_managers", {})
        return managers

    def leased_steps(self, model: _Model) -> list[int]:
        """The steps of `model` that a lease taken through this backend holds now."""
        manager = self._lease_managers.get((model.project, model.name))
        return sorted(manager.active_steps()) if manager is not None else []

    @asynccontextmanager
    async def adapter_lease(self, model: _Model, step: int) -> AsyncIterator[None]:
        """Pin `model`'s inference to step `step` and keep that step's checkpoint for the block.

        Inside it `model.get_inference_name()` (hence `model.rollout()`) is `<name>@<step>`,
        and deletions through this backend keep `step`. A step without a checkpoint is refused
        (`UnsupportedOptionError`) before anything is held."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"adapter_lease(): step must be an int, got {type(step).__name__}")
        steps = await self.checkpoint_steps(model)
        if step not in steps:
            raise UnsupportedOptionError(
                f"adapter_lease(): {model.project}/{model.name} has no checkpoint for step "
                f"{step} (its checkpoints: {steps}); lease one of those, e.g. the current step "
                "(`await model.get_step()`)."
            )
        manager = self._lease_managers.setdefault(
            (model.project, model.name), AdapterLeaseManager()
        )
        holds = f"{self._model_path(model)}/holds"
        await self._request("POST", holds, {"step": step})
        try:
            async with (
                manager.lease(step),
                pin_inference_target(model.name, step=step, inference_name=f"{model.name}@{step}"),
            ):
                yield
        finally:
            try:
                await self._request("POST", holds, {"step": step, "release": True})
            except ArtError as error:  # the block's own outcome wins; the failure is logged
                logger.warning("adapter_lease(): releasing step %d failed: %s", step, error)

    def exact_adapter_lease(self, model: _Model, step: int) -> AbstractAsyncContextManager[None]:
        """ART's exact lease: here the same as `adapter_lease`, since every step is already served
        immutably under its own name `<name>@<step>` (an async context manager)."""
        return self.adapter_lease(model, step)
