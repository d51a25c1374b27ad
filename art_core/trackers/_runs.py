"""Experiment-tracker runs (W&B, Trackio): what every tracker observer shares.

A tracker observer keeps one tracker run per model run (`project`, `run_name`), opened with the
model's first train step or log call and resumed under the same id by any later model object
with the same run name. It logs, at each step (the x-axis, `training_step` as ART names it):

    <split>/<metric>        every metric of the history row (a train step's, a log call's)
    <split>/trajectories    a sample of the step's trajectories: group, id, reward, advantage
                            (train), the exact messages (JSON)

and the run's config once (`run_config`). Which of a row's metrics a tracker sends is its own
rule (`_sent_metrics`: W&B keeps ART's whitelist, see `wandb/_metrics.py`); the model's history
keeps them all. When a run starts, where to see it (`run_link`: its URL, or its local folder and
the command that opens it) goes into the model's history as a "tracker" row, which the review
page's model page shows (`RemoteBackend.record_tracker_run`). An SDK that raises never fails training: the call is
dropped, counted in the model's next step metrics (`<tracker>/failed_calls`) and warned about
once, as Langfuse export does. The SDK-specific parts are three methods of a subclass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from art_core._observers import ObservedModel, StepFinished
from art_core.trajectories import TrajectoryGroup
from art_core.types import TrainResult

logger = logging.getLogger("art_core.trackers")

TRAJECTORIES_PER_STEP = 16  # the sample each step shows: enough to read, small enough to send
# What the server itself puts in a log call's row (`StepLog.log`); the rest of it is the user's.
LOG_SUMMARY_KEYS = frozenset(
    {"reward", "reward_std", "exceptions", "trajectories", "dropped/non_finite_metrics"}
)


@dataclass(frozen=True)
class TrajectoryRow:
    """One sampled trajectory as a tracker shows it."""

    group: int
    trajectory_id: str
    reward: float
    advantage: float | None
    messages: list[dict[str, Any]]

    @property
    def messages_json(self) -> str:
        return json.dumps(self.messages, ensure_ascii=False, default=str)


def run_name_of(model: ObservedModel) -> str:
    """The tracker identity of `model`: its `run_name` (ART's), else its served name."""
    return str(getattr(model, "run_name", None) or model.name)


def run_config(model: ObservedModel) -> dict[str, Any]:
    """What a tracker run records as its config: the model's names, base model, LoRA settings
    and the user's own `config` (ART's `model.config`)."""
    config: dict[str, Any] = {"project": model.project, "name": model.name}
    config["run_name"] = run_name_of(model)
    for attribute in ("base_model", "lora_config", "config"):
        value = getattr(model, attribute, None)
        if value is None:
            continue
        dump = getattr(value, "model_dump", None)
        config[attribute] = dump(mode="json") if callable(dump) else value
    return config


def split_metrics(split: str, metrics: Mapping[str, float]) -> dict[str, float]:
    """A history row's metrics under their split, as ART logs them (`train/reward`)."""
    return {f"{split}/{key}": float(value) for key, value in metrics.items()}


def user_metric_keys(groups: Sequence[TrajectoryGroup]) -> set[str]:
    """The metric names the user's groups and trajectories carry (ART's custom metrics)."""
    keys = {key for group in groups for key in group.metrics}
    keys.update(key for group in groups for t in group.trajectories for key in t.metrics)
    return keys


def trajectory_rows(
    groups: Sequence[TrajectoryGroup],
    advantages: Mapping[str, float] | None = None,
    limit: int = TRAJECTORIES_PER_STEP,
) -> list[TrajectoryRow]:
    """Up to `limit` trajectories, taken from the groups in turn so that each group shows."""
    queues = [list(group.trajectories) for group in groups]
    rows: list[TrajectoryRow] = []
    depth = 0
    while len(rows) < limit and any(depth < len(queue) for queue in queues):
        for index, queue in enumerate(queues):
            if depth < len(queue) and len(rows) < limit:
                trajectory = queue[depth]
                rows.append(
                    TrajectoryRow(
                        group=index,
                        trajectory_id=trajectory.id,
                        reward=float(trajectory.reward),
                        advantage=(advantages or {}).get(trajectory.id),
                        messages=trajectory.messages(),
                    )
                )
        depth += 1
    return rows


class TrackerObserver:
    """A step observer that mirrors a model's history into an experiment tracker's run.

    Subclasses name the tracker (`name`) and implement `_open` (start or resume the run),
    `_log` (metrics and trajectory rows at a step) and `_close`. Train steps come through the
    observer seam (`step_started`); log calls through `logged`, which `TrainableModel.log`
    calls with the row the backend recorded.
    """

    name = "tracker"

    def __init__(self, *, trajectories_per_step: int = TRAJECTORIES_PER_STEP) -> None:
        self.trajectories_per_step = trajectories_per_step
        self.runs: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._unreported: dict[tuple[str, str], Counter[str]] = {}
        self._warned = False
        self._recording: set[asyncio.Task[Any]] = set()  # "tracker" rows on their way

    # ------------------------------------------------------------------- the SDK's part

    def _open(self, model: ObservedModel, config: dict[str, Any]) -> Any:
        """Start (or resume, same id) the tracker run of `model`; returns the SDK's run."""
        raise NotImplementedError

    def _log(
        self, run: Any, step: int, split: str, metrics: dict[str, float], rows: list[TrajectoryRow]
    ) -> None:
        raise NotImplementedError

    def _close(self, run: Any) -> None:
        raise NotImplementedError

    def _is_open(self, run: Any) -> bool:
        """False when the SDK finished the run behind our back (it is then resumed)."""
        return True

    def _sent_metrics(
        self, split: str, metrics: dict[str, float], user_keys: set[str]
    ) -> dict[str, float]:
        """The part of a row's metrics this tracker sends (all; W&B keeps ART's whitelist)."""
        return metrics

    def run_link(self, model: ObservedModel) -> str | None:
        """Where to see `model`'s tracker run (a URL, or how to open it locally); None if none."""
        return None

    # --------------------------------------------------------------------- the observer

    def step_metrics(self, model: ObservedModel) -> dict[str, float]:
        """The tracker calls that failed since the model's last step (`<name>/failed_calls`)."""
        with self._lock:
            counts = self._unreported.pop(_key(model), Counter())
        return {f"{self.name}/{key}": float(value) for key, value in counts.items()}

    def step_started(
        self,
        model: ObservedModel,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        options: Mapping[str, Any],
    ) -> StepFinished | None:
        """A train step's row is logged when it is over (a log call's comes to `logged`)."""
        if split != "train":
            return None

        def finished(result: TrainResult | None) -> None:
            if result is not None:
                self._record(model, groups, "train", result.step, result.metrics, result.advantages)

        return finished

    def logged(
        self,
        model: ObservedModel,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: Mapping[str, float],
    ) -> None:
        """A log call's row, as the backend recorded it (its metrics, at its step)."""
        # A log call's own metrics are the user's too, but for the summary the server adds.
        user_keys = set(metrics) - LOG_SUMMARY_KEYS
        self._record(model, groups, split, step, metrics, also_user_keys=user_keys)

    def finish(self) -> None:
        """Close every run this observer opened (the SDKs also close them at exit)."""
        with self._lock:
            runs, self.runs = list(self.runs.values()), {}
        for run in runs:
            self._safely(None, lambda run=run: self._close(run))

    # ------------------------------------------------------------------------ internals

    def _record(
        self,
        model: ObservedModel,
        groups: list[TrajectoryGroup],
        split: str,
        step: int,
        metrics: Mapping[str, float],
        advantages: Mapping[str, float] | None = None,
        *,
        also_user_keys: AbstractSet[str] = frozenset(),
    ) -> None:
        """Send a history row (its metrics, a sample of its trajectories) to the tracker run;
        the user's metrics are the groups' and trajectories' own, and `also_user_keys`."""
        user_keys = user_metric_keys(groups) | also_user_keys

        def send() -> None:
            run = self._run_for(model)
            rows = trajectory_rows(groups, advantages, self.trajectories_per_step)
            sent = self._sent_metrics(split, split_metrics(split, metrics), user_keys)
            self._log(run, step, split, sent, rows)

        self._safely(model, send)

    def _run_for(self, model: ObservedModel) -> Any:
        key = _key(model)
        with self._lock:
            run = self.runs.get(key)
        if run is None or not self._is_open(run):
            run = self._open(model, run_config(model))
            with self._lock:
                self.runs[key] = run
            self._record_run(model, run)
        return run

    def _record_run(self, model: ObservedModel, run: Any) -> None:
        """Put where to see the new run into the model's history (a "tracker" row), sent on
        the running event loop by a backend that records it (`record_tracker_run`)."""
        link = self.run_link(model)
        try:
            record = getattr(getattr(model, "backend", None), "record_tracker_run", None)
            loop = asyncio.get_running_loop()
        except Exception:  # noqa: BLE001 - an unregistered model, no loop: nothing to record in
            return
        if link is None or not callable(record):
            return
        online = link.startswith(("http://", "https://"))
        row = {
            "tracker": self.name,
            "run_id": str(getattr(run, "id", "") or run_name_of(model)),
            "url": link if online else None,
            "how_to_open": None if online else link,
        }
        task = loop.create_task(record(model, row))
        self._recording.add(task)
        task.add_done_callback(lambda done: self._recorded(model, done))

    def _recorded(self, model: ObservedModel, task: asyncio.Task[Any]) -> None:
        self._recording.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._safely(model, lambda: _raise(error))

    def _safely(self, model: ObservedModel | None, action: Any) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 - a tracker never fails training
            if model is not None:
                with self._lock:
                    self._unreported.setdefault(_key(model), Counter())["failed_calls"] += 1
            if not self._warned:
                self._warned = True
                logger.warning(
                    "%s: a call failed (%s: %s); training goes on. Failed calls are counted in "
                    "the step metric %s/failed_calls. This warning is shown once.",
                    self.name,
                    type(error).__name__,
                    error,
                    self.name,
                )


def _raise(error: BaseException) -> None:
    raise error


def _key(model: ObservedModel) -> tuple[str, str]:
    return (model.project, run_name_of(model))
