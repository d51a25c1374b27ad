"""The pipeline's settings, state and group rules (`art_core.pipeline_trainer._trainer` runs the pipeline).

ART's names: `PipelineRuntimeConfig`, `PipelineState`, the rollout and eval function types; the
keywords ART's PipelineTrainer takes that this one does not, with what to use instead; and the
rules applied to each group (the step it was sampled at, zero reward variance).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import Field

from art_core._unknown_fields import StrictModel
from art_core.model import TrainableModel
from art_core.trajectories import Trajectory, TrajectoryGroup
from art_core.types import TrainConfig
from art_core.utils._signal import carries_signal

ScenarioT = TypeVar("ScenarioT")
ConfigT = TypeVar("ConfigT")

RolloutFn = Callable[[TrainableModel, ScenarioT, ConfigT], Awaitable[TrajectoryGroup]]
SingleRolloutFn = Callable[[TrainableModel, ScenarioT, ConfigT], Awaitable[Trajectory]]


class RolloutExecutor(Protocol):
    """Runs a rollout function elsewhere (another process, a cluster: `art_ray.RayExecutor`)."""

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """An awaitable of `fn(*args, **kwargs)`'s result, computed where the executor runs it."""
        ...


EvalItems = Sequence[Trajectory | TrajectoryGroup]
EvalFn = Callable[
    [TrainableModel, int, ConfigT], Awaitable[EvalItems | Mapping[str, EvalItems] | None]
]

# Where a group keeps the step it was sampled at (ART keeps it on each trajectory).
POLICY_VERSION_KEY = "initial_policy_version"

# ART's PipelineTrainer keywords this trainer does not have, and what to use instead.
UNSUPPORTED_HINTS = {
    "autotune": "Pipeline autotuning is not implemented: set the pipeline sizes yourself.",
    "loss_fn_config": "Pass our TrainConfig fields as train_config=art.TrainConfig(...).",
    "kl_penalty_coef": "Our KL term is to the base model: train_config=art.TrainConfig(beta=...).",
    "save_checkpoint": "Every step is a checkpoint here (served as <name>@<step>).",
    "resume": "train() always resumes from the model's current step on the backend.",
    "limit_mean_steps_off_policy": "Use max_steps_off_policy (a strict bound).",
}
UNSUPPORTED_HINT = (
    "ART's {name!r} has no counterpart in art_core's PipelineTrainer (see its docstring)."
)


class PipelineRuntimeConfig(StrictModel):
    """How many rollout workers run, how many groups a step trains, and the queue's bound.

    `max_batch_size` None: 10 x `min_batch_size` (ART's default). `queue_maxsize` None:
    `max(1, max_steps_off_policy x max_batch_size)` (1 step's worth with no bound), as ART.
    """

    num_rollout_workers: int = Field(16, ge=1)
    min_batch_size: int = Field(4, ge=1)
    max_batch_size: int | None = Field(None, ge=1)
    queue_maxsize: int | None = Field(None, ge=1)


@dataclass
class PipelineState:
    """What the pipeline has done so far (ART's names; `failed_rollouts`, `failed_evals`,
    `refused_promotions` ours)."""

    policy_version: int = 0  # the step served now, which new rollouts sample
    next_training_step: int = 0  # policy_version + 1 while a step trains
    scenario_offset: int = 0
    total_scenarios_consumed: int = 0
    last_eval_step: int = 0
    accepted_trainable_groups: int = 0
    discarded_stale_groups: int = 0
    discarded_zero_variance_groups: int = 0
    failed_rollouts: int = 0
    failed_evals: int = 0
    max_queue_depth: int = 0
    accepted_steps: int = 0
    deleted_checkpoints: int = 0  # by checkpoint_retention_strategy
    refused_promotions: int = 0  # steps promote_if kept on disk but did not promote
    collapse_detected: bool = False
    done: bool = False
    completed_eval_steps: set[int] = field(default_factory=set)


@dataclass
class StepCounts:
    """What was dropped while the next step's batch was collected (reported with that step)."""

    stale: int = 0
    zero_variance: int = 0
    failed_rollouts: int = 0
    zero_variance_groups: list[TrajectoryGroup] = field(default_factory=list)


KNOWN_KEYWORDS = [
    "num_rollout_workers", "min_batch_size", "max_batch_size", "queue_maxsize", "pipeline",
    "learning_rate", "loss_fn", "normalize_advantages", "train_config", "max_steps",
    "discard_queue_multiplier", "max_steps_off_policy", "eval_every_n_steps", "eval_at_start",
    "checkpoint_retention_strategy", "checkpoint_retention_interval", "executor", "promote_if",
    "signal",
]  # fmt: skip


def step_train_config(
    base: TrainConfig | None,
    learning_rate: float | None,
    loss_fn: str | None,
    normalize_advantages: bool,
) -> TrainConfig:
    """The TrainConfig of every step: `base` (ours) with ART's keywords on top.

    What neither sets takes ART's PipelineTrainer defaults: learning_rate 1e-5, loss_fn "cispo".
    `loss_fn` is ART's "cispo" or "ppo", or one of our presets; TrainConfig validates it.
    """
    fields = base.model_dump(exclude_unset=True) if base is not None else {}
    if learning_rate is not None or "learning_rate" not in fields:
        fields["learning_rate"] = 1e-5 if learning_rate is None else learning_rate
    if loss_fn is not None or "loss" not in fields:
        fields["loss"] = loss_fn or "cispo"
    if not normalize_advantages:
        fields["scale_rewards"] = "none"
    return TrainConfig(**fields)


def policy_version(group: TrajectoryGroup, default: int) -> int:
    version = group.metadata.get(POLICY_VERSION_KEY)
    return int(version) if isinstance(version, int) else default


def zero_variance(group: TrajectoryGroup) -> bool:
    """ART's test: fewer than two rewards, or all equal (GRPO learns nothing from it)."""
    return not carries_signal(group)


def eval_groups(items: EvalItems | None) -> list[TrajectoryGroup]:
    """Groups as given, loose trajectories gathered into one more group."""
    if not items:
        return []
    groups = [item for item in items if isinstance(item, TrajectoryGroup)]
    loose = [item for item in items if isinstance(item, Trajectory)]
    if len(groups) + len(loose) != len(items):
        raise TypeError("eval_fn must return art.Trajectory / art.TrajectoryGroup items")
    return [*groups, TrajectoryGroup(loose)] if loose else groups


def async_iterator(scenarios: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[Any]:
    if isinstance(scenarios, AsyncIterator):
        return scenarios

    async def iterate() -> AsyncIterator[Any]:
        for scenario in scenarios:
            yield scenario

    return iterate()


async def until_stopped(stop: asyncio.Event, awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    """(True, result) when `awaitable` finishes first; (False, None) once `stop` is set."""
    if stop.is_set():
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        return False, None
    operation = asyncio.ensure_future(awaitable)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((operation, stopped), return_when=asyncio.FIRST_COMPLETED)
        if operation.done():
            return True, operation.result()
        return False, None
    finally:
        for task in (operation, stopped):
            task.cancel()
        await asyncio.gather(operation, stopped, return_exceptions=True)
