"""`log`: groups and metrics recorded at a step, a history row and a trajectories file, without
counting a trained step twice. `StepLog` is that member of `TrainingService`.

Here too what every recorded step shares: its trajectory rows (`trajectory_rows`) and its reward
statistics and finite metrics (`reward_metrics`, `finite_metrics`), which train steps use as well.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from art_backend._errors import InvalidRequestError
from art_backend.store._checkpoints import ModelStore, read_trajectories
from art_backend.training._model_registry import RegisteredModel
from art_core.wire import GroupPayload, LogRequest


class StepLog:
    """A "log" history row and the trajectories it names, at a step of a registered model."""

    def __init__(self, in_trainer_thread: Callable[..., Awaitable[Any]]) -> None:
        """`in_trainer_thread`: the service's, where file work runs off the event loop."""
        self._in_trainer_thread = in_trainer_thread

    async def log(self, model: RegisteredModel, request: LogRequest) -> dict[str, Any]:
        """Record groups and/or metrics at a step: one "log" history row + trajectories file.

        The rule that keeps a trained step from counting twice: a step is its one "train" row,
        written by the train call (its trajectories in train/<step - 1>). A log never writes a
        "train" row. A train-split log at a step with a train row (ART's
        `model.log(groups, metrics=result.metrics, step=result.step, split="train")`) keeps
        out of its row the metrics that row already holds with the same value, and writes no
        trajectory whose id the train split already holds at that step or the one before; the
        answer counts them in `already_recorded`.
        """
        step = model.step if request.step is None else request.step
        if step > model.step:
            raise InvalidRequestError(
                f"step {step} is ahead of the model's step {model.step}: log at a step it has "
                "reached (result.step of a train call, or None for the current one).",
                param="step",
            )
        if request.tracker is not None:  # where a tracker shows the run: its own row
            model.store.append_history({**request.tracker, "type": "tracker", "step": step})
            return {"step": step, "tracker": request.tracker}
        if not request.groups and not request.metrics:
            raise InvalidRequestError(
                "Nothing to log: pass trajectory groups, metrics= or both.", param="groups"
            )
        metrics = _group_metrics(request.groups) if request.groups else {}
        metrics.update(request.metrics)  # the caller's own, as ART merges them
        metrics = finite_metrics(metrics)
        if not request.groups and not metrics["dropped/non_finite_metrics"]:
            del metrics["dropped/non_finite_metrics"]  # a metrics-only log holds just those
        rows = trajectory_rows(request.groups)
        repeated_metrics: list[str] = []
        known_ids: set[str] = set()
        if request.split == "train":
            trained = [
                row
                for row in model.store.read_history()
                if row.get("type") == "train" and row.get("step") == step
            ]
            for row in trained:
                for key, value in row.get("metrics", {}).items():
                    if metrics.get(key) == value:
                        repeated_metrics.append(key)
                        del metrics[key]
            known_ids = await self._in_trainer_thread(_logged_ids, model.store, "train", step)
        written = [row for row in rows if row.get("id") is None or row["id"] not in known_ids]
        record: dict[str, Any] = {
            "type": "log", "split": request.split, "step": step, "metrics": metrics,
        }  # fmt: skip
        if repeated_metrics or len(written) < len(rows):
            record["already_recorded"] = {
                "metrics": sorted(repeated_metrics),
                "trajectories": len(rows) - len(written),
            }
        model.store.append_history(record)
        if written:
            await self._in_trainer_thread(
                model.store.write_trajectories, request.split, step, written
            )
        return {k: v for k, v in record.items() if k != "type"}


def _group_metrics(groups: list[GroupPayload]) -> dict[str, float]:
    """A log's summary of its groups: reward mean/std, each trajectory metric's mean, counts."""
    rewards = [t.reward for g in groups for t in g.trajectories]
    metrics = reward_metrics(rewards)
    per_metric: dict[str, list[float]] = {}
    non_finite = 0  # a trajectory's inf or NaN metric: left out of its mean, counted
    for group in groups:
        for trajectory in group.trajectories:
            for key, value in trajectory.metrics.items():
                if math.isfinite(value):
                    per_metric.setdefault(key, []).append(value)
                else:
                    non_finite += 1
    metrics.update({key: mean_and_std(values)[0] for key, values in per_metric.items()})
    metrics["exceptions"] = float(sum(len(g.exceptions) for g in groups))
    metrics["trajectories"] = float(len(rewards))
    for group in groups:
        for key, value in group.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + value
    metrics["dropped/non_finite_metrics"] = float(non_finite)
    return metrics


def _logged_ids(store: ModelStore, split: str, step: int) -> set[str]:
    """Trajectory ids the split's files of `step` and `step - 1` already hold."""
    ids: set[str] = set()
    for at in (step - 1, step):
        path = store.trajectories_path(split, at) if at >= 0 else None
        if path is not None and path.is_file():
            ids.update(str(row["id"]) for row in read_trajectories(path) if "id" in row)
    return ids


def trajectory_rows(
    groups: list[GroupPayload], annotations: dict[tuple[int, str], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The rows of `trajectories/<split>/<step>.jsonl.gz`: one per trajectory and per exception.

    `annotations[(group index, trajectory id)]` adds what the trainer did with a trajectory
    (its advantage, a reviewer's decision it applied).
    """
    rows = []
    for group_index, group in enumerate(groups):
        for trajectory in group.trajectories:
            extra = (annotations or {}).get((group_index, trajectory.id), {})
            rows.append({"group": group_index, **trajectory.model_dump(), **extra})
        for exception in group.exceptions:
            rows.append({"group": group_index, "exception": exception})
    return rows


def reward_metrics(rewards: list[float]) -> dict[str, float]:
    """A step's `reward` and `reward_std` (0 for no rewards)."""
    if not rewards:
        return {"reward": 0.0, "reward_std": 0.0}
    mean, std = mean_and_std(rewards)
    return {"reward": mean, "reward_std": std}


def mean_and_std(values: list[float]) -> tuple[float, float]:
    """Mean and population std of finite values, without overflow near the float limits.

    Computed on values / (their largest magnitude): `fmean([1e308, 1e308, 0])` raises
    OverflowError, the mean of [1, 1, 0] cannot, and neither result can exceed that magnitude.
    """
    scale = max(abs(value) for value in values) or 1.0
    unit = [value / scale for value in values]
    std = statistics.pstdev(unit) * scale if len(unit) > 1 else 0.0
    return statistics.fmean(unit) * scale, std


def finite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The finite metrics, with `dropped/non_finite_metrics` counting the others (inf, NaN)."""
    finite = {key: value for key, value in metrics.items() if math.isfinite(value)}
    dropped = len(metrics) - len(finite)
    finite["dropped/non_finite_metrics"] = finite.get("dropped/non_finite_metrics", 0.0) + dropped
    return finite
