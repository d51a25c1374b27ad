"""Step observers: what watches a model's steps without the model knowing what it is.

A `TrainableModel` tells each of its observers (`model.observers`) when a train step or a log
call starts, before any work (an observer may refuse its options then, with a named error), and
calls back what the observer returns when the step is over, with the step's `TrainResult` (None
for a log call or a step that failed). An observer may also add counts to the model's next
step metrics. Langfuse export is one (`art_core.trackers.langfuse.LangfuseObserver`); a user's
own observer (a progress notifier, a W&B logger) is another.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class ObservableModel(ObservedModel, Protocol):
    """A model whose steps are observed (a `TrainableModel`): its observers, the counts it made
    since its last step, and its step, which a finished train step moves."""

    observers: list[StepObserver]
    pending_metrics: Counter[str]
    step: int


@dataclass
class ObservedStep:
    """A step in `observed_step`: the counts it reports (`pending`), its result once known."""

    pending: dict[str, float] = field(default_factory=dict)
    result: TrainResult | None = None


@contextlib.asynccontextmanager
async def observed_step(
    model: object,
    groups: list[TrajectoryGroup],
    split: str,
    options: Mapping[str, Any] | None = None,
) -> AsyncIterator[ObservedStep]:
    """Tell `model`'s observers a train step (split "train") or a log call starts; on the way
    out, tell them it is over with `step.result` (None when the block raised or set none).

    A train step takes the model's pending counts (plus the observers' own) into `step.pending`
    for the request to send; a failed one puts them back for the next step. A finished step
    moves `model.step`. A model without observers (any `ModelRef`) passes through.
    """
    step = ObservedStep()
    if not isinstance(model, ObservableModel):
        yield step
        return
    training = split == "train"
    if training:
        for observer in model.observers:
            model.pending_metrics.update(observer.step_metrics(model))
    callbacks = [
        callback
        for observer in model.observers
        if (callback := observer.step_started(
            model, groups, split=split, step=model.step, options=options or {}
        )) is not None
    ]  # fmt: skip
    if training:
        step.pending = {key: float(value) for key, value in model.pending_metrics.items()}
        model.pending_metrics.clear()
    try:
        yield step
    except BaseException:
        if training:
            model.pending_metrics.update(step.pending)  # not reported: the next step reports them
        step.result = None
        raise
    finally:
        for callback in callbacks:
            callback(step.result)
    if training and step.result is not None:
        model.step = step.result.step
