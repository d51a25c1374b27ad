"""What the executor asks the Ray cluster itself: whether the resources the workers need exist,
whether every node is on loopback (`art_ray.testing`'s clusters), whether a node still runs tasks."""

from __future__ import annotations

import asyncio
import contextlib

import ray
import ray.exceptions


def check_resources(resources: dict[str, float], num_cpus: float) -> None:
    """A resource no node has would leave the workers pending forever: say so now."""
    available = ray.cluster_resources()
    missing = [name for name in resources if name not in available]
    if missing:
        have = ", ".join(sorted(k for k in available if not k.startswith("node:"))) or "none"
        example = f'{{"{missing[0]}": 8}}'
        how = (
            # Every node on loopback: art_ray.testing.local_cluster (ray start cannot).
            f"start the local cluster with `local_cluster(..., node_resources={example})` "
            "(its worker nodes carry them)"
            if loopback_cluster()
            else f"start the rollout nodes with `ray start --resources='{example}'`"
        )
        raise ValueError(
            f"no node in the Ray cluster has the resource(s) {', '.join(missing)} "
            f"(the cluster has: {have}); {how}, or drop resources="
        )
    if num_cpus > available.get("CPU", 0):
        raise ValueError(
            f"num_cpus={num_cpus} per worker, but the cluster has {available.get('CPU', 0)} CPUs"
        )


def loopback_cluster() -> bool:
    """Whether every node of the cluster listens on 127.0.0.1 (`art_ray.testing`'s clusters)."""
    with contextlib.suppress(Exception):
        addresses = {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
        return addresses == {"127.0.0.1"}
    return False


async def node_answers(node_id: str) -> bool:
    """Whether a fresh task pinned to the node runs there within seconds."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = _probe.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote()
    try:
        await asyncio.wait_for(asyncio.ensure_future(probe), 5.0)
    except (TimeoutError, ray.exceptions.RayError):
        ray.cancel(probe, force=True)
        return False
    return True


@ray.remote(num_cpus=0, max_retries=0)
def _probe() -> bool:
    return True
