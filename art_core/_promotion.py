"""The promotion gate: a trained step is served by the plain name only if a held-out metric holds.

    gate = art.PromotionGate(evaluate=held_out, metric="reward", margin=0.05)
    await model.train(groups, promote_if=gate)

One gated step, top to bottom in `PromotionGate.gated_step`:
  the promoted step's metric, the bar (once per model: the history's last verdict, else
  `evaluate` on that step) -> step N+1 trained with `promote=False`, from the promoted step or
  the latest (`train_from`) -> `evaluate(model, N+1)` -> promoted unless its metric is worse
  than the best so far by more than `margin` -> the verdict sent to the backend (`/promote`:
  the plain name moves or stays; one "promotion" history row either way) -> the gate's numbers
  join the step's metrics, so the model's trackers see them.

The gate runs on the client because the evaluation is the user's rollout code. A refused step
stays on disk and served as `name@N+1`; `model.get_inference_name()` and the plain name keep
the promoted step.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from art_core.errors import PromotionGateError
from art_core.trajectories import TrajectoryGroup
from art_core.types import TrainResult
from art_core.wire import MAX_DETAIL_CHARACTERS

__all__ = ["PromotionGate"]

# evaluate(model, step) -> the metric itself, or held-out groups to read it from.
Evaluate = Callable[[Any, int], Awaitable[float | Sequence[TrajectoryGroup]]]
# train(promote, train_from_step) -> the step's result (the backend's train request).
TrainStep = Callable[[bool, int | None], Awaitable[TrainResult]]
TRAIN_FROM = ("promoted", "latest")


@dataclass
class _GateState:
    """Where one model stands: the step its plain name serves, the bar, the refusals so far."""

    promoted_step: int
    best: float
    best_step: int
    refused_total: int = 0


@dataclass
class PromotionGate:
    """Promote a trained step only if its held-out metric did not drop by more than `margin`.

    `evaluate(model, step)`: your held-out evaluation of `step`, served as
    `model.get_inference_name(step)`; it returns the metric, or the held-out groups (then
    `metric` is "reward", their mean reward, or the mean of a trajectory metric of that name).
    `margin` is in the metric's units, against the best promoted step so far (higher is
    better; `higher_is_better=False` for a loss). `train_from`: the next step trains from the
    promoted step ("promoted") or from the latest step, refused or not ("latest").
    """

    evaluate: Evaluate
    metric: str = "reward"
    margin: float = 0.05
    train_from: Literal["promoted", "latest"] = "promoted"
    higher_is_better: bool = True
    _states: dict[tuple[str, str], _GateState] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not callable(self.evaluate):
            raise PromotionGateError(
                "PromotionGate: evaluate must be an async function (model, step) -> float or "
                f"list of art.TrajectoryGroup, got {type(self.evaluate).__name__}."
            )
        if not isinstance(self.metric, str) or not self.metric:
            raise PromotionGateError(
                f"PromotionGate: metric must be a metric name such as 'reward', got {self.metric!r}."
            )
        margin = self.margin
        if isinstance(margin, bool) or not isinstance(margin, int | float):
            raise PromotionGateError(f"PromotionGate: margin must be a number, got {margin!r}.")
        if not (math.isfinite(margin) and margin >= 0):
            raise PromotionGateError(
                f"PromotionGate: margin must be a finite number >= 0 (how far the metric may "
                f"drop below the best step's and still promote), got {margin!r}."
            )
        if self.train_from not in TRAIN_FROM:
            raise PromotionGateError(
                f"PromotionGate: train_from must be 'promoted' or 'latest', got {self.train_from!r}."
            )

    # -------------------------------------------------------------------------------- one step

    async def gated_step(
        self, model: Any, backend: Any, train: TrainStep
    ) -> tuple[TrainResult, PromotionGateError | None]:
        """Train one step through the gate; returns its result (the gate's numbers in its
        metrics) and the error that kept it from being judged, if any (raised by the caller
        once the step is recorded)."""
        state = await self._state_for(model, backend)
        train_from = state.promoted_step if self.train_from == "promoted" else None
        result = await train(False, train_from)
        if result.metrics.get("trained", 1.0) == 0.0:  # nothing trained: nothing to judge
            result.promoted_step = state.promoted_step
            return result, None
        error: PromotionGateError | None = None
        value: float | None = None
        try:
            value = await self._measure(model, result.step)
        except PromotionGateError as caught:
            error = caught
        promote = value is not None and self._holds(value, state.best)
        if promote:
            assert value is not None
            state.promoted_step = result.step
            if value == self._better(value, state.best):
                state.best, state.best_step = value, result.step
        else:
            state.refused_total += 1
        metrics = {
            "gate/promoted": float(promote),
            "gate/refused": float(not promote),
            "gate/refused_total": float(state.refused_total),
            "gate/evaluate_errors": float(error is not None),
            "gate/best": state.best,
            "gate/margin": float(self.margin),
            "gate/promoted_step": float(state.promoted_step),
            **({} if value is None else {"gate/value": value}),
        }
        details = {
            "metric": self.metric,
            "best_step": state.best_step,
            "train_from": self.train_from,
            "trained_from": train_from if train_from is not None else result.step - 1,
            # Within the server's bound on a details string (a long traceback in a message).
            "error": None if error is None else str(error)[:MAX_DETAIL_CHARACTERS],
        }
        await backend.promote(model, result.step, promote=promote, metrics=metrics, details=details)
        result.metrics.update(metrics)
        result.promoted_step = state.promoted_step
        if error is not None:
            cause = error.__cause__  # what evaluate raised, kept for the traceback
            error = PromotionGateError(
                f"{error} Step {result.step} is trained and kept on disk (served as "
                f"{model.name}@{result.step}) but not promoted: {model.name} still serves step "
                f"{state.promoted_step}.",
                result=result,
            )
            error.__cause__ = cause
        return result, error

    def _holds(self, value: float, best: float) -> bool:
        """The rule: not worse than the best so far by more than `margin`."""
        drop = best - value if self.higher_is_better else value - best
        return drop <= self.margin

    def _better(self, a: float, b: float) -> float:
        return max(a, b) if self.higher_is_better else min(a, b)

    # ------------------------------------------------------------------------------- the metric

    async def _measure(self, model: Any, step: int) -> float:
        """`evaluate(model, step)` as one finite number; every failure a PromotionGateError."""
        try:
            evaluation = await self.evaluate(model, step)
        except Exception as error:
            raise PromotionGateError(
                f"PromotionGate: evaluate raised at step {step}: {type(error).__name__}: {error}."
            ) from error
        return self.metric_of(evaluation, step)

    def metric_of(self, evaluation: Any, step: int) -> float:
        """The gate's metric from what `evaluate` returned: a number, or held-out groups."""
        if isinstance(evaluation, TrajectoryGroup):
            evaluation = [evaluation]
        if isinstance(evaluation, int | float) and not isinstance(evaluation, bool):
            value = float(evaluation)
        elif isinstance(evaluation, Sequence) and all(
            isinstance(group, TrajectoryGroup) for group in evaluation
        ):
            trajectories = [t for group in evaluation for t in group.trajectories]
            if not trajectories:
                raise PromotionGateError(
                    f"PromotionGate: the evaluation of step {step} returned no trajectories "
                    "(every held-out rollout raised?): there is no metric to judge."
                )
            if self.metric == "reward":
                values = [t.reward for t in trajectories]
            else:
                values = [
                    float(t.metrics[self.metric]) for t in trajectories if self.metric in t.metrics
                ]
            if not values:
                known = sorted({"reward", *(key for t in trajectories for key in t.metrics)})
                raise PromotionGateError(
                    f"PromotionGate: unknown metric {self.metric!r}: no trajectory of the "
                    f"evaluation of step {step} has it. Its metrics are {', '.join(known)}."
                )
            value = sum(values) / len(values)
        else:
            raise PromotionGateError(
                f"PromotionGate: evaluate must return a number or a list of art.TrajectoryGroup, "
                f"got {type(evaluation).__name__} at step {step}."
            )
        if not math.isfinite(value):
            raise PromotionGateError(
                f"PromotionGate: the {self.metric} of step {step} is {value}, not a finite number."
            )
        return value

    async def _state_for(self, model: Any, backend: Any) -> _GateState:
        """The model's standing: kept by this gate, else the backend's last verdict (when it
        was on this metric and still names the promoted step), else a baseline evaluation of
        the promoted step (whose failure stops the call before anything trains)."""
        key = (model.project, model.name)
        if key in self._states:
            return self._states[key]
        promoted = await backend.promoted_step(model)
        verdicts = [row for row in await backend.history(model) if row.get("type") == "promotion"]
        last = verdicts[-1] if verdicts else None
        if (
            last is not None
            and last.get("metric") == self.metric
            and last.get("promoted_step") == promoted
            and "gate/best" in last.get("metrics", {})
        ):
            metrics = last["metrics"]
            state = _GateState(
                promoted,
                best=float(metrics["gate/best"]),
                best_step=int(last.get("best_step", promoted)),
                refused_total=int(metrics.get("gate/refused_total", 0)),
            )
        else:
            try:
                value = await self._measure(model, promoted)
            except PromotionGateError as error:
                raise PromotionGateError(
                    f"{error} That was the baseline (the promoted step {promoted}, the bar for "
                    "the next step): nothing was trained."
                ) from error.__cause__
            state = _GateState(promoted, best=value, best_step=promoted)
        self._states[key] = state
        return state
