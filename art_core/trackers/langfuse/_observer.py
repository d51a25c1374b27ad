"""The Langfuse tracker: the step observer that `report_metrics=["langfuse"]` names.

On when LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_HOST (or LANGFUSE_BASE_URL) are set,
required when named, off with `report_metrics=[]`; `report_metrics=[LangfuseObserver(exporter)]`
sends to that `art.LangfuseExporter`. (The per-call `langfuse=` of `train`/`log` is deprecated.)
`LangfuseObserver(review=LangfuseReview(...))` also reads decisions made in Langfuse on a step
held for review back to the trainer (`_review.py`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from art_core._observers import ObservedModel, StepFinished
from art_core.trackers.langfuse._default_exporter import resolve_exporter, take_unreported
from art_core.trackers.langfuse._exporter import LangfuseExporter
from art_core.trackers.langfuse._review import HeldStepReview, LangfuseReview
from art_core.trajectories import TrajectoryGroup
from art_core.types import TrainResult

logger = logging.getLogger("art_core.langfuse")


class LangfuseObserver:
    """The step observer that exports a model's groups as Langfuse traces.

    A train step's traces are queued when it starts and sent when it is over, with each
    trajectory's advantage (a failed step's without); a log call's at once. Which exporter is
    used is the model's `export` (a call's deprecated `langfuse=` overrides it; see
    `resolve_exporter`). Traces sent or dropped since
    the model's last step are that step's `langfuse/...` metrics.

    `export` is the model's choice, as `langfuse=` took it: None exports when the LANGFUSE_*
    variables are set, True requires export (a named error now, without the extra or the
    settings), an `art.LangfuseExporter` sends to that one. `TrainableModel(report_metrics=
    ["langfuse"])` builds it with `requested=True`; the default (`report_metrics=None`), without.

    `review=art_core.trackers.langfuse.LangfuseReview(...)`: while a train step is held for
    review, scores and annotation-queue status set in Langfuse on its traces become decisions
    on the review page (source `langfuse`); see `_review.py`.
    """

    def __init__(
        self,
        export: bool | LangfuseExporter | None = None,
        *,
        requested: bool = False,
        review: LangfuseReview | None = None,
    ) -> None:
        self.export = True if requested and export is None else export
        self.review = review
        if self.export is True:
            resolve_exporter(True)  # a missing extra or setting fails here, not at step 1

    def step_metrics(self, model: ObservedModel) -> Counter[str]:
        """This model's traces exported or dropped since its last step."""
        return take_unreported(f"{model.project}/{model.name}")

    def step_started(
        self,
        model: ObservedModel,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        options: Mapping[str, Any],
    ) -> StepFinished | None:
        """Queue the groups (a bad `langfuse=` raises here, before any work)."""
        exporter = resolve_exporter(options.get("langfuse", self.export))
        if exporter is None:
            return None
        try:
            job = exporter.export_groups(
                model, groups, split=split, step=step, wait_for_advantages=split == "train"
            )
        except Exception as error:  # noqa: BLE001 - export must never fail training
            logger.warning("Langfuse export of this %s call skipped: %s", split, error)
            return None
        if job is None:
            return None

        held = None
        if self.review is not None and split == "train":
            held = HeldStepReview(exporter, self.review, model, job)

        def finished(result: TrainResult | None) -> None:
            if held is not None:
                held.finished()
            job.release(result.advantages if result is not None else None)

        return finished
