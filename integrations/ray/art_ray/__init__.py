"""Rollouts on a Ray cluster: `RayExecutor` runs the user's rollout functions in async worker
actors, and the user's loop (`gather_trajectory_groups`, `PipelineTrainer`) stays as it is.

    import art_ray

    executor = art_ray.RayExecutor(workers=4, address="auto")
    group = art.TrajectoryGroup(executor.run(rollout, model, scenario) for _ in range(8))

Install with the `[ray]` extra (core Ray; art_core itself never imports Ray).
"""

from art_ray._errors import (
    INFRASTRUCTURE_ERRORS,
    ExecutorShutdownError,
    NoLiveWorkersError,
    RayAuthenticationError,
    RayClusterUnreachableError,
    RolloutBlockedError,
    RolloutExitError,
    RolloutTimeoutError,
    WorkerStartError,
)
from art_ray._executor import RayExecutor
from art_ray._stats import ExecutorStats

__all__ = [
    "INFRASTRUCTURE_ERRORS",
    "ExecutorShutdownError",
    "ExecutorStats",
    "NoLiveWorkersError",
    "RayAuthenticationError",
    "RayClusterUnreachableError",
    "RayExecutor",
    "RolloutBlockedError",
    "RolloutExitError",
    "RolloutTimeoutError",
    "WorkerStartError",
]
