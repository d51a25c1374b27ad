"""`ExecutorStats`: what a `RayExecutor` did with each call, counted once."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ExecutorStats:
    """What the executor did: where rollouts ran, what was retried, what failed. Each call ends
    in exactly one of `completed`, `failed`, `lost` and `cancelled`."""

    completed: int = 0  # calls that returned a result
    failed: int = 0  # the rollout's fault: its exception (SystemExit too), deadline, blocked loop
    retried: int = 0  # calls sent again: Ray lost their worker, or a neighbour blocked its loop
    lost: int = 0  # calls that failed on Ray's side past `infra_retries` (raised, counted)
    cancelled: int = 0  # calls in flight when `shutdown` ran (raised ExecutorShutdownError)
    timed_out: int = 0  # of `failed`: past `timeout`
    blocked: int = 0  # of `failed`: held their worker's loop past `heartbeat`
    workers_replaced: int = 0  # dead, blocked or timed-out workers replaced by fresh ones
    nodes: Counter[str] = field(default_factory=Counter)  # node id -> rollouts completed there
