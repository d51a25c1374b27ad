"""Trackio through the maintained SDK: local-first, no account, its own dashboard.

On only when named (`report_metrics=["trackio"]`): unlike W&B there is no key whose presence
says "track this", and a tracker that wrote to ~/.cache on every model unasked would surprise.
(`make demo` names it when trackio is installed.) The run: Trackio project = the model's
project, run `name` = its run name, `resume="allow"` (a later model object with that run name
continues the same run id), `config` once. Metrics go at the history step (Trackio's x-axis);
each step's sample of trajectories is a list of `trackio.Trace` (OpenAI-style messages,
metadata: group, trajectory id, reward, advantage) under `<split>/trajectories`. Every metric of
the history row goes to Trackio (W&B keeps ART's whitelist; a local store has no reason to).

Where it goes is the SDK's rule: TRACKIO_DIR (default ~/.cache/huggingface/trackio), one
SQLite file per project; `trackio show --project <project>` opens the dashboard on it.
TRACKIO_SPACE_ID or TRACKIO_SERVER_URL send it elsewhere, as the SDK documents.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from art_core._observers import ObservedModel
from art_core.errors import UnsupportedOptionError
from art_core.trackers._runs import TrackerObserver, TrajectoryRow, run_name_of


def trackio_installed() -> bool:
    """Whether the `[trackio]` extra (the trackio SDK) is importable."""
    return importlib.util.find_spec("trackio") is not None


def trackio_tracker(*, requested: bool = False) -> TrackioObserver | None:
    """The `report_metrics` entry: named, a TrackioObserver; by default, off (None)."""
    return TrackioObserver() if requested else None


class TrackioObserver(TrackerObserver):
    """Logs a model's train steps and log calls to its Trackio run (see the module docstring)."""

    name = "trackio"

    def __init__(self, **options: Any) -> None:
        if not trackio_installed():
            raise UnsupportedOptionError(
                "report_metrics=['trackio'] needs the trackio SDK: pip install "
                "'art-trainer[trackio]' (or leave 'trackio' out of report_metrics)."
            )
        super().__init__(**options)

    def _open(self, model: ObservedModel, config: dict[str, Any]) -> Any:
        import trackio

        return trackio.init(
            project=model.project,
            name=run_name_of(model),
            config=config,
            resume="allow",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def _log(
        self, run: Any, step: int, split: str, metrics: dict[str, float], rows: list[TrajectoryRow]
    ) -> None:
        import trackio

        data: dict[str, Any] = dict(metrics)
        if rows:
            data[f"{split}/trajectories"] = [
                trackio.Trace(
                    messages=row.messages,
                    metadata={
                        "split": split,
                        "group": row.group,
                        "trajectory_id": row.trajectory_id,
                        "reward": row.reward,
                        "advantage": row.advantage,
                    },
                )
                for row in rows
            ]
        run.log(data, step=step)

    def _close(self, run: Any) -> None:
        run.finish()

    def _is_open(self, run: Any) -> bool:
        # trackio.init finishes the process's previous run: a model whose run was finished so
        # resumes it (same id) at its next step.
        stop = getattr(run, "_stop_flag", None)
        return not (stop is not None and stop.is_set())

    def run_link(self, model: ObservedModel) -> str | None:
        """Where the run is stored and the command that opens its dashboard."""
        run = self.runs.get((model.project, run_name_of(model)))
        if run is None:
            return None
        from trackio.utils import TRACKIO_DIR

        return (
            f"Trackio run {run.name} (id {run.id}) in {TRACKIO_DIR}: open the dashboard with "
            f"`trackio show --project {model.project}`"
        )
