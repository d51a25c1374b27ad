"""The scope of one zero-change rollout (`async with model.rollout() as r:`): its URL, and
afterwards its trajectory, assembled from the completions the server recorded under its id."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from art_core._unknown_fields import check_names
from art_core.backend import Backend, new_rollout_id
from art_core.capture._records import trajectory_from_records
from art_core.trajectories import Trajectory

logger = logging.getLogger("art_core.model")


class CapturedModel(Protocol):
    """What a rollout scope reads from its model (a `TrainableModel`)."""

    @property
    def backend(self) -> Backend: ...

    def get_inference_name(self, step: int | None = None) -> str: ...


class RolloutCapture:
    """The scope of one zero-change rollout: its URL, and afterwards its trajectory.

    Set `reward`, and fill `metrics` and `metadata`, inside the block; any other attribute
    (`r.rewrd = 1`) raises `UnknownFieldError` rather than being silently dropped.
    """

    _ATTRIBUTES = frozenset(
        {
            "trainable_model",
            "id",
            "model",
            "base_url",
            "api_key",
            "_backend",
            "_trajectory",
            "reward",
            "metrics",
            "metadata",
        }
    )

    def __init__(self, model: CapturedModel) -> None:
        # The TrainableModel itself (typed loosely: art_core.model imports this module).
        self.trainable_model: Any = model
        self.id = new_rollout_id()
        self.model = model.get_inference_name()
        self.base_url = model.backend.rollout_base_url(self.id)
        self.api_key = model.backend.api_key or "unused"
        self._backend = model.backend
        self._trajectory: Trajectory | None = None
        self.reward = 0.0
        self.metrics: dict[str, float | int | bool] = {}
        self.metadata: dict[str, Any] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._ATTRIBUTES:
            # The message lists what a rollout sets; the rest are read-only in spirit.
            check_names(
                "RolloutCapture", [name], ["reward", "metrics", "metadata"], noun="attribute"
            )
        super().__setattr__(name, value)

    @property
    def trajectory(self) -> Trajectory:
        if self._trajectory is None:
            raise RuntimeError("the trajectory is assembled when the `async with` block exits")
        return self._trajectory

    async def collect(self) -> Trajectory:
        """Assemble the trajectory from every completion the server recorded for this rollout."""
        records = await self._backend.rollout_records(self.id)
        self._trajectory = trajectory_from_records(
            records,
            reward=self.reward,
            metrics=self.metrics,
            metadata={**self.metadata, "rollout_id": self.id},
        )
        return self._trajectory

    async def fail(self, error: BaseException) -> None:
        """The run raised: keep its calls so far on `error` (for review), release the records."""
        try:
            records = await asyncio.wait_for(self._backend.rollout_records(self.id), 10)
            partial = trajectory_from_records(
                records, reward=0.0, metadata={**self.metadata, "rollout_id": self.id}
            )
            await asyncio.wait_for(self._backend.discard_rollout(self.id), 10)
        except Exception as cleanup_error:  # noqa: BLE001 - the run's own error is what matters
            # The records stay on the server until they expire (counted on its /metrics).
            logger.warning("rollout %s: could not release its records: %s", self.id, cleanup_error)
            return
        error.art_trajectory = partial  # type: ignore[attr-defined]
        error.add_note(
            f"art: rollout {self.id} ended by {type(error).__name__} after "
            f"{len(records)} recorded call(s); not trained (its calls are kept on the exception)."
        )
