"""The user's loop on the head host: run as `python -m tests.netns._driver SCENARIO JSON` inside
a namespace host (tests/netns/_deployment.py), it prints one JSON line, its answer.

  rollouts   gather groups of two-turn rollouts through `RayExecutor(address="auto")` on the
             rollout nodes, against an art-server on another host, and train one step on them
  slow       slow rollouts that mark when they run (a test pulls a cable meanwhile)
  connect    only start a `RayExecutor` and ask where its workers run (token checks)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import art_core as art
from art_ray import RayExecutor
from tests.ray._rollouts import slow_rollout, two_turn_rollout
from tests.support.models import fresh_model

QUESTIONS = ["Count to three.", "Name a colour.", "Say hello.", "Pick a number."]


def node_addresses() -> dict[str, str]:
    """Ray's node id -> the address the node advertises."""
    import ray

    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}


def executor_stats(executor: RayExecutor) -> dict[str, Any]:
    stats = vars(executor.stats).copy()
    stats["nodes"] = dict(stats["nodes"])
    return stats


async def rollouts(spec: dict[str, Any]) -> dict[str, Any]:
    backend = art.RemoteBackend(spec["server"], api_key=spec["key"])
    model = await fresh_model(backend, Path(spec["model"]))
    started = time.perf_counter()
    with RayExecutor(
        workers=spec.get("workers", 2), address="auto", resources={"art_rollout": 1}, timeout=120
    ) as executor:
        where = await executor.where()
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(
                    executor.run(two_turn_rollout, model, question)
                    for _ in range(spec.get("per_group", 4))
                )
                for question in QUESTIONS[: spec.get("groups", 4)]
            ),
            pbar_desc=None,
        )
        seconds = time.perf_counter() - started
        addresses = node_addresses()
        answer: dict[str, Any] = {
            "worker_hosts": sorted({addresses[w["node_id"]] for w in where}),
            "rollout_hosts": sorted(
                {addresses[t.metadata["node_id"]] for g in groups for t in g.trajectories}
            ),
            "trajectories": sum(len(g.trajectories) for g in groups),
            "exceptions": sum(len(g.exceptions) for g in groups),
            "stats": executor_stats(executor),
            "seconds": seconds,
        }
    if spec.get("train"):
        for group in groups:
            for index, trajectory in enumerate(group.trajectories):
                trajectory.reward = float(index)
        result = await model.train(groups, learning_rate=1e-3)
        answer["step"] = model.step
        answer["ratio_mean"] = result.metrics["ratio_mean"]
    await backend.close()
    return answer


async def slow(spec: dict[str, Any]) -> dict[str, Any]:
    marks = Path(spec["marks"])
    with RayExecutor(
        workers=2, address="auto", resources={"art_rollout": 1}, timeout=120,
        infra_retries=spec.get("infra_retries", 1),
    ) as executor:  # fmt: skip
        await executor.where()
        groups = await art.gather_trajectory_groups(
            [
                art.TrajectoryGroup(
                    executor.run(slow_rollout, str(marks), index, spec["seconds"])
                    for index in range(spec["runs"])
                )
            ],
            pbar_desc=None,
            max_exceptions=spec["runs"],
        )
        addresses = node_addresses()
        return {
            "rewards": sorted(t.reward for t in groups[0].trajectories),
            "exceptions": [e.type for e in groups[0].exceptions],
            "rollout_hosts": sorted(
                addresses[t.metadata["node_id"]] for t in groups[0].trajectories
            ),
            "stats": executor_stats(executor),
        }


async def connect(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        with RayExecutor(
            workers=1, address="auto", resources={"art_rollout": 1},
            start_timeout=spec.get("start_timeout", 300.0),
        ) as executor:  # fmt: skip
            where = await executor.where()
            return {"workers": len(where), "seconds": time.monotonic() - started}
    except Exception as error:  # noqa: BLE001 - the answer names it
        return {
            "error": type(error).__name__,
            "message": str(error),
            "seconds": time.monotonic() - started,
        }


SCENARIOS = {"rollouts": rollouts, "slow": slow, "connect": connect}

if __name__ == "__main__":
    try:
        answer = asyncio.run(SCENARIOS[sys.argv[1]](json.loads(sys.argv[2])))
    except BaseException as error:  # noqa: BLE001 - the test reads the traceback
        answer = {"crashed": type(error).__name__, "traceback": traceback.format_exc()}
    print(json.dumps(answer), flush=True)
