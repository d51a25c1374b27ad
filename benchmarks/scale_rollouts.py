"""Rollouts per minute when the environment is the bottleneck: plain asyncio vs Ray workers.

An environment-bound rollout: 4 turns, each a short policy wait (5 ms, a stand-in for a fast
model) and a tool that computes (a fixed amount of pure-Python work, ~25 ms here: a stand-in for
an MCP tool, a sandbox or a code runner doing CPU work). In one process such rollouts share one
core whatever asyncio does (the GIL); on Ray each worker actor is a process of its own.

Three contenders, interleaved run by run (the order rotates each repetition), medians:
- asyncio: `gather_trajectory_groups` over the rollouts in this process (today's path);
- ray x1: the same gather over `RayExecutor(workers=1).run(...)` (target: within 5 % of asyncio);
- ray x2: two workers, one per worker node (target: >= 1.7x one worker).

The cluster is `art_ray.testing.local_cluster`: a head and two worker nodes on 127.0.0.1, one CPU
each, on this 2-core machine, so the driver, Ray's daemons and the workers share two cores.

    .venv/bin/python benchmarks/scale_rollouts.py [--repetitions 5] [--rollouts 32]

Writes benchmarks/results/scale_rollouts.json and its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import OtherLoad, machine_info
from _markdown import publish

import art_core as art

RESULTS = Path(__file__).resolve().parent / "results" / "scale_rollouts.json"
START, END = "<!-- scale_rollouts:start -->", "<!-- scale_rollouts:end -->"
TURNS = 4
POLICY_WAIT = 0.005
TOOL_WORK = 700_000  # loop iterations of the computing tool (~25 ms on this machine)


def computing_tool(n: int) -> int:
    """Pure-Python CPU work: what a tool that computes costs the process that runs it."""
    total = 0
    for i in range(n):
        total = (total * 31 + i) % 1_000_003
    return total


async def environment_rollout(scenario: int) -> art.Trajectory:
    """TURNS turns of (policy wait, computing tool); defined in __main__, so Ray pickles it by
    value and the workers need nothing but art_core."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"scenario {scenario}"}]
    for turn in range(TURNS):
        await asyncio.sleep(POLICY_WAIT)
        result = computing_tool(TOOL_WORK + scenario)
        messages.append({"role": "tool", "content": str(result), "tool_call_id": f"t{turn}"})
    return art.Trajectory(messages_and_choices=messages, reward=float(scenario % 3))


def _ray_cpu() -> float:
    """CPU seconds used so far by this machine's Ray processes (daemons and workers)."""
    import psutil

    total = 0.0
    for process in psutil.process_iter(["name", "cmdline"]):
        name = process.info["name"] or ""
        command = " ".join(process.info["cmdline"] or [])
        if (
            name.startswith("ray::")
            or name in ("raylet", "gcs_server")
            or "ray/_private" in command
        ):
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


async def one_run(run: Any, rollouts: int) -> dict[str, float]:
    """`rollouts` rollouts as groups of 4 through one gather; wall time and rollouts/minute.
    Other load: cores busy outside this process tree and outside Ray's processes."""
    ray_before = _ray_cpu()
    with OtherLoad() as load:
        started = time.perf_counter()
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(run(environment_rollout, s) for _ in range(4))
                for s in range(rollouts // 4)
            ),
            pbar_desc=None,
        )
        wall = time.perf_counter() - started
    ray_cores = (_ray_cpu() - ray_before) / wall
    assert sum(len(g.trajectories) for g in groups) == rollouts
    return {
        "wall_s": wall,
        "per_minute": rollouts / wall * 60,
        "ray_cores": ray_cores,
        "other_load_cores": max(0.0, load.cores - ray_cores),
    }


async def in_process(fn: Any, *args: Any) -> Any:
    return await fn(*args)


async def measure(repetitions: int, rollouts: int) -> dict[str, Any]:
    import ray

    from art_ray import RayExecutor
    from art_ray.testing import local_cluster

    with (
        tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as tmp,
        local_cluster(nodes=2, tmp_dir=tmp, node_resources={"art_rollout": 2}) as cluster,
    ):
        ray.init(address=cluster.address, log_to_driver=False)
        one = RayExecutor(workers=1, resources={"art_rollout": 1})
        two = RayExecutor(workers=2, resources={"art_rollout": 1})
        contenders = {"asyncio": in_process, "ray x1": one.run, "ray x2": two.run}
        # Warm-up: worker processes start, art_core imports, the function is cached.
        for run in contenders.values():
            await one_run(run, 8)
        tool_ms = _tool_ms()
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        names = list(contenders)
        for repetition in range(repetitions):
            order = names[repetition % 3 :] + names[: repetition % 3]
            for name in order:
                runs[name].append(await one_run(contenders[name], rollouts))
                print(name, runs[name][-1], flush=True)
        nodes = len(set(two.stats.nodes))
        one.shutdown()
        two.shutdown()
    medians = {name: statistics.median(r["per_minute"] for r in rs) for name, rs in runs.items()}
    return {
        "machine": machine_info("ray", "torch"),
        "settings": {
            "repetitions": repetitions,
            "rollouts_per_run": rollouts,
            "turns": TURNS,
            "policy_wait_s": POLICY_WAIT,
            "tool_ms_measured": tool_ms,
        },
        "runs": runs,
        "median_per_minute": medians,
        "ray_x1_overhead": 1 - medians["ray x1"] / medians["asyncio"],
        "ray_x2_speedup_vs_x1": medians["ray x2"] / medians["ray x1"],
        "ray_x2_nodes_used": nodes,
        "median_other_load_cores": statistics.median(
            r["other_load_cores"] for rs in runs.values() for r in rs
        ),
    }


def _tool_ms() -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        computing_tool(TOOL_WORK)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def section(result: dict[str, Any]) -> str:
    m = result["median_per_minute"]
    s = result["settings"]
    machine = result["machine"]
    return "\n".join(
        [
            START,
            "## Rollouts on Ray: environment-bound rollouts per minute (`benchmarks/scale_rollouts.py`)",
            "",
            f"{s['rollouts_per_run']} rollouts a run (groups of 4, one gather), {s['turns']} turns "
            f"each of a {s['policy_wait_s'] * 1000:.0f} ms policy wait and a "
            f"{s['tool_ms_measured']:.0f} ms computing tool; medians of {s['repetitions']} "
            f"interleaved runs. Ray: a loopback `local_cluster` (head + 2 worker nodes, 1 CPU "
            f"each) on this {machine['cpu_count']}-core machine, ray {machine['ray']}, "
            f"{machine['date'][:10]}. Other load (median cores busy outside the benchmark's "
            f"process tree and Ray's processes): {result['median_other_load_cores']:.2f}.",
            "",
            "| contender | rollouts / minute | vs asyncio |",
            "|---|---:|---:|",
            *(
                f"| {name} | {value:.0f} | {value / m['asyncio']:.2f}x |"
                for name, value in m.items()
            ),
            "",
            f"- One Ray worker costs {result['ray_x1_overhead'] * 100:+.1f} % of plain asyncio's "
            f"throughput (target: at most 5 %).",
            f"- Two workers on {result['ray_x2_nodes_used']} nodes: "
            f"{result['ray_x2_speedup_vs_x1']:.2f}x one worker (target: at least 1.7x). In one "
            "process the tools' CPU work is serialised by the GIL whatever asyncio does; each "
            "Ray worker is a process of its own.",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--from-results", action="store_true", help="rewrite the section only")
    args = parser.parse_args()
    if args.from_results:
        import json

        result = json.loads(RESULTS.read_text())
    else:
        result = asyncio.run(measure(args.repetitions, args.rollouts))
    publish(result, RESULTS, START, END, section(result))


if __name__ == "__main__":
    main()
