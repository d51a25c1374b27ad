"""Step observers: what watches a model's steps without the model knowing what it is.

A `TrainableModel` tells each of its observers (`model.observers`) when a train step or a log
call starts, before any work (an observer may refuse its options then, with a named error), and
calls back what the observer returns when the step is over, with the step's `TrainResult` (None
for a log call or a step that failed). An observer may also add counts to the model's next
step metrics. Langfuse export is one (`art_core.trackers.langfuse._export.LangfuseObserver`); a user's own
observer (a progress notifier, a W&B logger) is another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from art_core.trajectories import TrajectoryGroup
from art_core.types import TrainResult

StepFinished = Callable[[TrainResult | None], None]


class ObservedModel(Protocol):
    """What an observer reads from a model: its names and its endpoint."""

    project: str
    name: str

    @property
    def inference_base_url(self) -> str | None: ...
    @property
    def inference_api_key(self) -> str | None: ...


class StepObserver(Protocol):
    """Watches the train steps and log calls of the models it is attached to."""

    def step_metrics(self, model: ObservedModel) -> Mapping[str, float]:
        """Counts to report with `model`'s next train step (e.g. `langfuse/exported_traces`)."""
        ...

    def step_started(
        self,
        model: ObservedModel,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        options: Mapping[str, Any],
    ) -> StepFinished | None:
        """A train step (split "train") or a log call on `groups` starts at `step`; returns
        what to call when it is over, or None. `options` are the call's observer keywords."""
        ...
