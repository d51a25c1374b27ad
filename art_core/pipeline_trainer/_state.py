"""The pipeline's state and group rules (`_trainer.py` runs the pipeline, `_settings.py` holds
what it was set to).

ART's names: `PipelineState`, the rollout and eval function types (and `make_group_rollout_fn`,
a group's rollout from one trajectory's); and the rules applied to each group (the step it was
sampled at, zero reward variance).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from art_core.model import TrainableModel
from art_core.trajectories import Trajectory, TrajectoryGroup
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


def make_group_rollout_fn(
    single_rollout_fn: SingleRolloutFn[ScenarioT, ConfigT], n: int = 4
) -> RolloutFn[ScenarioT, ConfigT]:
    """A RolloutFn that runs `single_rollout_fn` n times concurrently; exceptions stay on the group."""

    async def group_rollout(
        model: TrainableModel, scenario: ScenarioT, config: ConfigT
    ) -> TrajectoryGroup:
        results = await asyncio.gather(
            *(single_rollout_fn(model, scenario, config) for _ in range(n)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # a cancellation or KeyboardInterrupt is not a failed rollout
        return TrajectoryGroup(results)  # type: ignore[arg-type]

    return group_rollout


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
