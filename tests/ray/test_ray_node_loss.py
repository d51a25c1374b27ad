"""A worker node dies (its whole process tree SIGKILLed) while its rollouts run: they are sent
to a surviving worker, or, with retries off, counted as failed; the gather never hangs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_ray import RayExecutor
from art_ray.testing import add_node, kill_node
from tests.ray._rollouts import busy_rollout, slow_rollout
from tests.support.servers import free_port

RUNS = 8
SECONDS = 6.0  # long enough to kill a node while every run is in flight


async def run_and_kill(executor: RayExecutor, cluster: Any, marks: Path, **gather: Any):
    """Start RUNS slow rollouts, wait until all run, SIGKILL the node of the first one."""
    marks.mkdir()
    gathering = asyncio.ensure_future(
        art.gather_trajectory_groups(
            [
                art.TrajectoryGroup(
                    executor.run(slow_rollout, str(marks), i, SECONDS) for i in range(RUNS)
                )
            ],
            pbar_desc=None,
            **gather,
        )
    )
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < RUNS:
        assert time.monotonic() < deadline, "the rollouts never all started"
        assert not gathering.done(), gathering
        await asyncio.sleep(0.2)
    started_on = {path.read_text() for path in marks.iterdir()}
    assert len(started_on) == 2  # least-in-flight spread the runs over both workers
    [victim] = [node for node in cluster.worker_nodes if node.node_id == min(started_on)]
    killed = kill_node(cluster, victim)
    assert killed >= 2  # the raylet and at least the worker process
    [groups] = [await asyncio.wait_for(gathering, 120)]
    return groups[0], victim.node_id, started_on


async def test_rollouts_of_a_killed_node_are_retried_on_a_survivor(cluster: Any, tmp_path: Path):
    with RayExecutor(
        workers=2, resources={"art_rollout": 1}, infra_retries=1, timeout=120
    ) as executor:
        group, dead, started_on = await run_and_kill(executor, cluster, tmp_path / "marks")
        assert len(group.trajectories) == RUNS and not group.exceptions
        # The killed node's half ran again, on the survivor.
        assert {t.metadata["node_id"] for t in group.trajectories} == started_on - {dead}
        assert executor.stats.retried == RUNS // 2 and executor.stats.lost == 0
        assert executor.workers == 1
    # A new node in its place, for the next test.
    add_node(cluster, resources={"art_rollout": 1})


async def test_with_retries_off_a_killed_nodes_rollouts_are_counted(cluster: Any, tmp_path: Path):
    with RayExecutor(
        workers=2, resources={"art_rollout": 1}, infra_retries=0, timeout=120
    ) as executor:
        group, dead, _ = await run_and_kill(
            executor, cluster, tmp_path / "marks", max_exceptions=RUNS // 2
        )
        assert len(group.trajectories) == RUNS // 2
        assert len(group.exceptions) == RUNS // 2
        assert {e.type for e in group.exceptions} <= {"ActorDiedError", "ActorUnavailableError"}
        assert executor.stats.lost == RUNS // 2 and executor.stats.retried == 0
    await until_dead(dead)


async def until_dead(node_id: str) -> None:
    """Wait until Ray has marked the node dead (so nothing new is placed on it)."""
    import ray

    deadline = time.monotonic() + 90
    while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "Ray never marked the killed node dead"
        await asyncio.sleep(0.5)


async def test_address_auto_joins_the_running_cluster_and_leaves_it(cluster: Any, tmp_path: Path):
    import ray

    from tests.ray.conftest import WORKER_PYTHONPATH

    ray.shutdown()  # the driver leaves; the executor joins by itself
    try:
        with RayExecutor(
            workers=2, address="auto", runtime_env={"env_vars": {"PYTHONPATH": WORKER_PYTHONPATH}}
        ) as executor:
            assert ray.is_initialized()
            nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
            assert {w["node_id"] for w in await executor.where()} <= nodes
            trajectory = await executor.run(slow_rollout, str(tmp_path), 7, 0.0)
            assert trajectory.reward == 7.0 and trajectory.metadata["node_id"] in nodes
        assert not ray.is_initialized()  # it connected, so it disconnected
    finally:
        if not ray.is_initialized():
            ray.init(address=cluster.address, log_to_driver=False)


def test_an_address_where_no_cluster_answers_fails_at_once_by_name(
    monkeypatch: pytest.MonkeyPatch,
):
    """ray.init would retry a dead address for minutes; "auto" resolves to one (RAY_ADDRESS,
    or the last cluster `ray start` recorded) once that cluster has stopped."""
    from art_ray import RayClusterUnreachableError
    from art_ray._cluster import join

    closed = free_port()  # nothing listens there
    with pytest.raises(RayClusterUnreachableError, match=f"127.0.0.1:{closed}"):
        join(f"127.0.0.1:{closed}")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed}")
    with pytest.raises(RayClusterUnreachableError, match="resolved to it"):
        join("auto")


async def test_a_killed_node_with_a_busy_worker_is_replaced_and_its_rollouts_retried(
    cluster: Any, tmp_path: Path
):
    """The killed node's worker spins the CPU on its threads (plain `def` rollouts) while the
    heartbeat watches it: its calls go to the survivor, a fresh worker takes its place."""
    add_node(cluster, resources={"art_rollout": 1})  # two rollout nodes again
    marks, release = tmp_path / "marks", tmp_path / "release"
    marks.mkdir()
    # Heartbeat 5 s: on a loaded 2-core box (the suite beside vLLM's), four spinning threads
    # kept the worker's loop from a turn for over a second, and a 1 s heartbeat replaced it
    # before the kill (the busy runs then started again on the other node).
    with RayExecutor(
        workers=2, resources={"art_rollout": 1}, infra_retries=1, timeout=120, heartbeat=5.0
    ) as executor:
        await executor.where()
        # Least calls in flight alternates the workers: the even runs (busy) share one.
        gathering = asyncio.ensure_future(
            art.gather_trajectory_groups(
                [
                    art.TrajectoryGroup(
                        executor.run(busy_rollout, str(marks), i, str(release))
                        if i % 2 == 0
                        else executor.run(slow_rollout, str(marks), i, 2.0)
                        for i in range(RUNS)
                    )
                ],
                pbar_desc=None,
            )
        )
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < RUNS:
            assert time.monotonic() < deadline, "the rollouts never all started"
            assert not gathering.done(), gathering
            await asyncio.sleep(0.2)
        busy_nodes = {path.read_text() for path in marks.glob("busy-*")}
        assert len(busy_nodes) == 1, (busy_nodes, executor.stats)
        [busy_node] = busy_nodes
        [victim] = [node for node in cluster.worker_nodes if node.node_id == busy_node]
        assert kill_node(cluster, victim) >= 2
        release.touch()  # the busy runs sent again end at once
        [group] = await asyncio.wait_for(gathering, 120)
        assert sorted(t.reward for t in group.trajectories) == [float(i) for i in range(RUNS)]
        assert busy_node not in {t.metadata["node_id"] for t in group.trajectories}
        assert executor.stats.retried == RUNS // 2 and executor.stats.lost == 0

        add_node(cluster, resources={"art_rollout": 1})  # a place for the replacement
        deadline = time.monotonic() + 120
        while executor.stats.workers_replaced < 1:
            assert time.monotonic() < deadline, "the dead worker was never replaced"
            await asyncio.sleep(0.5)
        [after] = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(executor.run(slow_rollout, str(marks), i, 0.0) for i in range(8))],
            pbar_desc=None,
            max_exceptions=0,
        )
        assert len(after.trajectories) == 8
        assert executor.workers == 2
