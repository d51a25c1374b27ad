"""A multi-node Ray cluster on one machine, on 127.0.0.1 only (tests, benchmarks, trying it out).

`ray start` cannot do this: on Linux it replaces 127.0.0.1 by the machine's interface address, and
worker nodes refuse to join a loopback head. Ray's own `cluster_utils.Cluster` (what Ray's tests
use) keeps every node on loopback when Ray's single-machine switch is set, which `local_cluster`
does before Ray starts.

    with local_cluster(nodes=2, tmp_dir=tmp) as cluster:   # a head and two worker nodes
        with RayExecutor(workers=2, address=cluster.address, resources={"art_rollout": 1}):
            ...

Its worker nodes carry the custom resource `art_rollout` (8 each, as the rollout nodes of the
recipes in `deploy/`), so the same `resources={"art_rollout": 1}` places workers on them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["LOOPBACK_ENV", "ROLLOUT_RESOURCES", "add_node", "kill_node", "local_cluster"]

# What the worker nodes carry unless told otherwise: the recipes' rollout-node resource.
ROLLOUT_RESOURCES: dict[str, float] = {"art_rollout": 8}

# Set before Ray is imported anywhere: Ray reads them at import and at node start.
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # bind 127.0.0.1, never the interface address
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage report to Ray's servers
}


@contextlib.contextmanager
def local_cluster(
    nodes: int = 2,
    *,
    tmp_dir: str | Path,
    cpus_per_node: int = 1,
    head_cpus: int = 1,
    node_resources: dict[str, float] | None = None,
    object_store_mb: int = 150,
) -> Iterator[Any]:
    """A head node and `nodes` worker nodes on 127.0.0.1; shut down (every process) on exit.

    Worker nodes carry `node_resources` (default `ROLLOUT_RESOURCES`: `{"art_rollout": 8}`);
    the head does not. `tmp_dir` holds Ray's sessions and logs (Ray's socket paths must stay
    short: use a short folder). A driver joins with `ray.init(address=cluster.address)`, or
    `RayExecutor(address=cluster.address)` joins for it.
    """
    if node_resources is None:
        node_resources = dict(ROLLOUT_RESOURCES)
    os.environ.update(LOOPBACK_ENV)
    ray_tmp = Path(tmp_dir)
    (ray_tmp / "ray").mkdir(parents=True, exist_ok=True)
    os.environ["RAY_TMPDIR"] = str(ray_tmp)

    import ray
    import ray._private.ray_constants as ray_constants
    from ray.cluster_utils import Cluster

    # Ray read the switch when it was first imported; the driver process may have imported it
    # before this call (the child processes read the environment set above).
    ray_constants.ENABLE_RAY_CLUSTER = False

    cluster = Cluster(
        initialize_head=True,
        head_node_args=_loopback_node(num_cpus=head_cpus, object_store_mb=object_store_mb),
    )
    try:
        for _ in range(nodes):
            add_node(
                cluster,
                num_cpus=cpus_per_node,
                resources=node_resources,
                object_store_mb=object_store_mb,
            )
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def add_node(
    cluster: Any,
    *,
    num_cpus: int = 1,
    resources: dict[str, float] | None = None,
    object_store_mb: int = 150,
) -> Any:
    """One more worker node on 127.0.0.1 (e.g. after `kill_node`); returns Ray's node object."""
    return cluster.add_node(
        **_loopback_node(num_cpus=num_cpus, object_store_mb=object_store_mb),
        resources=dict(resources or {}),
    )


def _loopback_node(*, num_cpus: int, object_store_mb: int) -> dict[str, Any]:
    return {
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
        "num_cpus": num_cpus,
        "object_store_memory": object_store_mb * 1024 * 1024,
    }


def kill_node(cluster: Any, node: Any) -> int:
    """SIGKILL a worker node's whole process tree (raylet, its workers, its agents), as when a
    machine dies; returns how many processes were killed. Ray then sees the node die."""
    import psutil

    roots = [process.process.pid for process in _node_processes(node)]
    victims: dict[int, psutil.Process] = {}
    for pid in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                victims[process.pid] = process
    for process in victims.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(list(victims.values()), timeout=10)
    cluster.worker_nodes.discard(node)
    return len(victims)


def _node_processes(node: Any) -> list[Any]:
    return [info for infos in node.all_processes.values() for info in infos]
