"""A rollout that exits or blocks fails alone: it arrives as that rollout's failure, a worker it
poisoned is replaced, and eight normal rollouts afterwards all succeed; normal rollouts whose loop
it held past their deadline are moved to a fresh worker, not timed out. `shutdown()` with rollouts
in flight ends them as counted `ExecutorShutdownError`s."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_ray import ExecutorShutdownError, RayExecutor, RolloutBlockedError
from tests.ray import _rollouts
from tests.ray._rollouts import loop_spinning_rollout, slow_rollout, waiting_rollout

HEARTBEAT = 1.0  # seconds a worker's loop may go without answering
SHORT = 3.0  # the deadline where the case is a deadline
LONG = 60.0  # where it is not (the heartbeat finds the blocked loop first)

CASES = [
    # rollout, what it arrives as, whether its worker is replaced, the executor's timeout
    ("exiting_rollout", "RolloutExitError", False, LONG),  # SystemExit(3) in an async def
    ("interrupted_rollout", "RolloutExitError", False, LONG),  # KeyboardInterrupt
    ("sync_exiting_rollout", "RolloutExitError", False, LONG),  # SystemExit in a plain def
    ("exiting_task_rollout", "RolloutExitError", False, LONG),  # SystemExit in its own task
    ("sync_sleeping_rollout", "RolloutTimeoutError", True, SHORT),  # time.sleep(120), a def
    ("sync_spinning_rollout", "RolloutTimeoutError", True, SHORT),  # CPU for 120 s, a def
    ("loop_sleeping_rollout", "RolloutBlockedError", True, LONG),  # time.sleep in async def
    # CPU in an async def: test_the_neighbours_of_a_spinning_rollout_are_moved_not_timed_out
]


@pytest.mark.parametrize(
    ("name", "failure", "replaced", "timeout"), CASES, ids=[c[0] for c in CASES]
)
async def test_a_poisoning_rollout_fails_alone_and_the_next_eight_succeed(
    cluster: Any, tmp_path: Path, name: str, failure: str, replaced: bool, timeout: float
):
    with RayExecutor(workers=2, timeout=timeout, heartbeat=HEARTBEAT) as executor:
        await executor.where()  # both workers started
        # The poison first, so that a neighbour shares its worker (least calls in flight).
        [group] = await art.gather_trajectory_groups(
            [
                art.TrajectoryGroup(
                    [
                        executor.run(getattr(_rollouts, name), 120.0),
                        *(executor.run(slow_rollout, str(tmp_path), i, 0.5) for i in range(3)),
                    ]
                )
            ],
            pbar_desc=None,
            max_exceptions=1,
        )
        [failed] = group.exceptions
        assert failed.type == failure, failed.message
        if failure == "RolloutExitError":
            assert "SystemExit" in failed.message or "KeyboardInterrupt" in failed.message
        if failure == "RolloutBlockedError":
            assert "asyncio.to_thread" in failed.message
        # The neighbours all came back (sent to another worker where theirs was killed).
        assert sorted(t.reward for t in group.trajectories) == [0.0, 1.0, 2.0]
        stats = executor.stats
        assert (stats.failed, stats.completed, stats.lost) == (1, 3, 0)
        assert stats.timed_out == (failure == "RolloutTimeoutError")
        assert stats.blocked == (failure == "RolloutBlockedError")
        assert stats.workers_replaced == replaced
        assert executor.workers == 2

        [after] = await art.gather_trajectory_groups(
            [
                art.TrajectoryGroup(
                    executor.run(slow_rollout, str(tmp_path), i, 0.0) for i in range(8)
                )
            ],
            pbar_desc=None,
            max_exceptions=0,
        )
        assert sorted(t.reward for t in after.trajectories) == [float(i) for i in range(8)]
        assert (stats.failed, stats.completed, stats.lost) == (1, 11, 0)


async def test_the_neighbours_of_a_spinning_rollout_are_moved_not_timed_out(
    cluster: Any, tmp_path: Path
):
    # The deadline is shorter than the heartbeat: it passes before the blocked loop can be
    # found, so the normal rollouts' deadlines must not be spent on the held loop.
    with RayExecutor(workers=1, timeout=2.5, heartbeat=3.0) as executor:
        release = tmp_path / "release"
        release.write_text("")
        await executor.run(waiting_rollout, str(tmp_path), -1, str(release))  # imports done
        release.unlink()
        marks = tmp_path / "marks"
        marks.mkdir()
        normal = [
            asyncio.ensure_future(executor.run(waiting_rollout, str(marks), i, str(release)))
            for i in range(8)
        ]
        await _until(lambda: len(list(marks.iterdir())) == 8, normal)
        spinning = asyncio.ensure_future(executor.run(loop_spinning_rollout, str(marks), 120.0))
        await _until(lambda: len(list(marks.glob("spinning-*"))) == 1, [*normal, spinning])
        release.write_text("")  # too late for the held loop: only a moved rollout sees it

        outcomes = await asyncio.wait_for(
            asyncio.gather(*normal, spinning, return_exceptions=True), 120
        )
        [spun_on] = [int(path.name.split("-")[1]) for path in marks.glob("spinning-*")]
        *trajectories, failed = outcomes
        assert [type(t) for t in trajectories] == [art.Trajectory] * 8, trajectories
        assert isinstance(failed, RolloutBlockedError), failed
        assert spun_on not in {t.metadata["pid"] for t in trajectories}  # ran on the new worker
        stats = executor.stats
        assert (stats.completed, stats.failed, stats.blocked, stats.timed_out) == (9, 1, 1, 0)
        assert (stats.retried, stats.lost, stats.workers_replaced) == (8, 0, 1)
        assert executor.workers == 1


async def _until(condition: Any, running: list[asyncio.Future[Any]]) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, "the rollouts never all started"
        assert not any(call.done() for call in running), running
        await asyncio.sleep(0.05)


async def test_shutdown_with_rollouts_in_flight_ends_each_as_counted(cluster: Any, tmp_path: Path):
    executor = RayExecutor(workers=2, timeout=LONG, heartbeat=HEARTBEAT)
    calls = [
        asyncio.ensure_future(executor.run(slow_rollout, str(tmp_path), i, LONG)) for i in range(4)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.iterdir())) < 4:
        assert time.monotonic() < deadline, "the rollouts never all started"
        await asyncio.sleep(0.2)
    late = asyncio.ensure_future(executor.run(slow_rollout, str(tmp_path), 9, LONG))
    executor.shutdown()
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, late, return_exceptions=True), 60)
    assert [type(outcome) for outcome in outcomes] == [ExecutorShutdownError] * 5
    stats = executor.stats
    assert (stats.cancelled, stats.completed, stats.failed, stats.lost) == (5, 0, 0, 0)
    with pytest.raises(RuntimeError, match="shut down"):
        executor.run(slow_rollout, str(tmp_path), 10, 0.0)
