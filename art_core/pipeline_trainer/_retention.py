"""Checkpoint retention for PipelineTrainer (ART's `art.pipeline_trainer` retention names).

A strategy sees the checkpoints that may be deleted, with the metrics logged at each, and
returns the steps to keep; the rest are deleted through the backend. The current step and the
steps rollouts may still sample are never offered, so a deletion cannot pull a served model
from under a running rollout; nor is the promoted step (the plain name serves it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from datetime import datetime

from pydantic import BaseModel, Field

from art_core.backend import Backend, ModelRef


class CheckpointInfo(BaseModel):
    """One checkpoint a retention strategy may keep or delete, with its logged metrics."""

    step: int
    path: str | None = None
    created_at: datetime | None = None
    is_eval_step: bool = False
    metrics: dict[str, float] = Field(default_factory=dict)


class CheckpointRetentionContext(BaseModel):
    """The checkpoints a strategy may delete (current and in-use steps are never among them)."""

    current_step: int
    checkpoints: list[CheckpointInfo] = Field(default_factory=list)


# A strategy returns the steps, among the context's checkpoints, to keep; the rest are deleted.
CheckpointRetentionStrategy = Callable[[CheckpointRetentionContext], Iterable[int]]


def keep_recent_and_top(
    *, recent: int = 5, top: int = 2, metric: str = "val/reward"
) -> CheckpointRetentionStrategy:
    """Keep the `recent` latest checkpoints and the `top` best by `metric` (higher is better)."""
    if recent < 0 or top < 0:
        raise ValueError(f"recent and top must be >= 0, got recent={recent}, top={top}")

    def strategy(context: CheckpointRetentionContext) -> set[int]:
        by_step = sorted(context.checkpoints, key=lambda checkpoint: checkpoint.step)
        keep = (
            {checkpoint.step for checkpoint in by_step[len(by_step) - recent :]}
            if recent
            else set()
        )
        scored = [c for c in context.checkpoints if metric in c.metrics]
        scored.sort(key=lambda c: (c.metrics[metric], c.step), reverse=True)
        return keep | {checkpoint.step for checkpoint in scored[:top]}

    return strategy


async def apply_retention(
    backend: Backend,
    model: ModelRef,
    strategy: CheckpointRetentionStrategy,
    step: int,
    *,
    oldest_in_use: int,
    eval_steps: set[int],
    protected: Collection[int] = (),
) -> int:
    """Offer the checkpoints older than `oldest_in_use` (and not `protected`) to `strategy`,
    delete the ones it does not keep; returns how many were deleted. A kept step it was not
    offered is a ValueError."""
    eligible = [
        s for s in await backend.checkpoint_steps(model) if s < oldest_in_use and s not in protected
    ]
    if not eligible:
        return 0
    metrics: dict[int, dict[str, float]] = {}
    for row in await backend.history(model):
        if row.get("type") == "log" and row.get("step") in eligible:
            logged = metrics.setdefault(row["step"], {})
            for key, value in row.get("metrics", {}).items():
                if isinstance(value, int | float):
                    logged[f"{row.get('split')}/{key}"] = float(value)
    context = CheckpointRetentionContext(
        current_step=step,
        checkpoints=[
            CheckpointInfo(step=s, is_eval_step=s in eval_steps, metrics=metrics.get(s, {}))
            for s in eligible
        ],
    )
    keep = set(strategy(context))
    if unknown := keep - set(eligible):
        raise ValueError(
            f"checkpoint_retention_strategy kept steps {sorted(unknown)} that it was not "
            f"offered (offered: {eligible}); return steps from context.checkpoints only."
        )
    delete = sorted(set(eligible) - keep)
    if not delete:
        return 0
    # A step an adapter lease holds is skipped by the backend (its answer's `held`).
    answer = await backend.delete_checkpoint_steps(model, delete)
    return len(answer.get("deleted", delete))
