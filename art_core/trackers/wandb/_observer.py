"""Weights & Biases through the maintained SDK, with ART's rules.

On by default (`report_metrics=None`) when WANDB_API_KEY is set, as ART; `report_metrics=
["wandb"]` turns it on whatever the environment (WANDB_MODE=offline writes the run under
WANDB_DIR for a later `wandb sync`, no network). The run: `project` = the model's project,
`entity` = its entity, `name` and `id` = its run name, `resume="allow"`, so a restarted
program continues the same run. `training_step` is every metric's x-axis (define_metric), so
a late evaluation lands at its step; each step's sample of trajectories is a `wandb.Table`
under `<split>/trajectories`. Only ART's whitelist of a row's metrics reaches the run
(canonical keys, costs, the user's own: `_metrics.py`); the model's history keeps them all.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

from art_core._observers import ObservedModel
from art_core.errors import UnsupportedOptionError
from art_core.trackers._runs import TrackerObserver, TrajectoryRow, run_name_of
from art_core.trackers.wandb._metrics import wandb_metrics

logger = logging.getLogger("art_core.trackers")

COLUMNS: list[str | int] = ["group", "trajectory_id", "reward", "advantage", "messages"]
_not_installed_warned = False


def wandb_installed() -> bool:
    """Whether the `[wandb]` extra (the wandb SDK) is importable."""
    return importlib.util.find_spec("wandb") is not None


def wandb_tracker(*, requested: bool = False) -> WandbObserver | None:
    """The `report_metrics` entry: named, a WandbObserver (the SDK must be installed); by
    default, one only when WANDB_API_KEY is set (ART's rule), else None (off)."""
    global _not_installed_warned
    if requested:
        return WandbObserver()
    if not os.environ.get("WANDB_API_KEY"):
        return None
    if not wandb_installed():
        if not _not_installed_warned:
            _not_installed_warned = True
            logger.warning(
                "WANDB_API_KEY is set but the wandb SDK is not installed: nothing is logged to "
                "W&B. pip install 'art-trainer[wandb]' to log training to W&B."
            )
        return None
    return WandbObserver()


class WandbObserver(TrackerObserver):
    """Logs a model's train steps and log calls to its W&B run (see the module docstring).

    `settings`: extra `wandb.Settings` fields (e.g. `{"mode": "offline"}`); by default the SDK
    reads its environment (WANDB_MODE, WANDB_DIR, WANDB_ENTITY, ...).
    """

    name = "wandb"

    def __init__(self, *, settings: dict[str, Any] | None = None, **options: Any) -> None:
        if not wandb_installed():
            raise UnsupportedOptionError(
                "report_metrics=['wandb'] needs the wandb SDK: pip install 'art-trainer[wandb]' "
                "(or leave 'wandb' out of report_metrics)."
            )
        super().__init__(**options)
        self.settings = dict(settings or {})

    def _open(self, model: ObservedModel, config: dict[str, Any]) -> Any:
        import wandb

        run_name = run_name_of(model)
        run = wandb.init(
            project=model.project,
            entity=getattr(model, "entity", None),
            name=run_name,
            id=run_name,
            resume="allow",
            config=config,
            # Several models may log from one process; the run mirrors the model's history,
            # not the process's console.
            reinit="create_new",
            # Read at each run's start: the SDK reads its environment once per process.
            dir=os.environ.get("WANDB_DIR") or None,
            mode=os.environ.get("WANDB_MODE") or None,  # type: ignore[arg-type]
            settings=wandb.Settings(console="off", **self.settings),
        )
        run.define_metric("training_step")
        run.define_metric("*", step_metric="training_step")
        return run

    def _log(
        self, run: Any, step: int, split: str, metrics: dict[str, float], rows: list[TrajectoryRow]
    ) -> None:
        import wandb

        data: dict[str, Any] = {"training_step": step, **metrics}
        if rows:
            data[f"{split}/trajectories"] = wandb.Table(
                columns=COLUMNS,
                data=[
                    [row.group, row.trajectory_id, row.reward, row.advantage, row.messages_json]
                    for row in rows
                ],
                allow_mixed_types=True,
            )
        run.log(data)

    def _close(self, run: Any) -> None:
        run.finish()

    def _is_open(self, run: Any) -> bool:
        return not getattr(run, "_is_finished", False)

    def _sent_metrics(
        self, split: str, metrics: dict[str, float], user_keys: set[str]
    ) -> dict[str, float]:
        """ART's rule: canonical keys, costs and the user's own metrics (`_metrics.py`)."""
        return wandb_metrics(split, metrics, user_keys)

    def run_link(self, model: ObservedModel) -> str | None:
        """The run's URL online; offline, its folder and the command that uploads it."""
        run = self.runs.get((model.project, run_name_of(model)))
        if run is None:
            return None
        if run.url:
            return str(run.url)
        folder = os.path.dirname(run.dir)
        return f"W&B run {run.id} (offline): {folder}; upload with `wandb sync {folder}`"
