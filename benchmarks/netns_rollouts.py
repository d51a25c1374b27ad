"""Rollouts on one rollout host against two, across network namespaces (root only).

Three namespace hosts (tests/support/netns.py) deployed as docs/cluster.md tells a user: Ray head,
art-server (the tiny random model) and the loop on host a; rollout nodes b, then b and c. Each
round gathers 4 groups of 4 two-turn rollouts through `RayExecutor(address="auto")` (1 worker
with one rollout host, 2 with two) and reports the gather's seconds, medians over repetitions.
The server on host a decodes every turn, so on this 2-core machine the figure says what the hosts
add (Ray's calls across a real network stack), not how rollouts scale on real machines.

    sudo .venv/bin/python benchmarks/netns_rollouts.py [--repetitions 3]

Writes benchmarks/results/netns_rollouts.json (with the machine's load average, other work
included) and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "backend"), str(ROOT / "integrations" / "ray")]

from tests.netns._deployment import API_KEY, Deployment  # noqa: E402
from tests.support import netns  # noqa: E402
from tests.support.tiny_model import build_tiny_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "netns_rollouts.json"


def gather_seconds(deployment: Deployment, head: str, server: str, model: Path, workers: int):
    answer = deployment.drive(
        deployment.network.hosts[0], "rollouts", env={"RAY_ADDRESS": head}, server=server,
        key=API_KEY, model=str(model), workers=workers,
    )  # fmt: skip
    if "crashed" in answer:
        raise RuntimeError(answer["traceback"])
    return answer


def main() -> None:
    """Measure 1 rollout host against 2 and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    reason = netns.unavailable()
    if reason:
        sys.exit(reason)
    netns.sweep_leftovers()
    load_before = os.getloadavg()
    figures: dict[str, list[float]] = {"1 host": [], "2 hosts": []}
    routed: dict[str, list[str]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="nsb-", dir="/tmp") as root,
        netns.network(3) as network,
    ):
        model = build_tiny_model(Path(root) / "model")
        deployment = Deployment(network, Path(root), token="b" * 32, logs=Path(root))
        try:
            a, b, c = network.hosts
            head = deployment.start_head(a)
            deployment.start_worker(b, head)
            server = deployment.start_server(a, model)
            for label, workers in (("1 host", 1), ("2 hosts", 2)):
                if workers == 2:
                    deployment.start_worker(c, head)
                for _ in range(args.repetitions):
                    answer = gather_seconds(deployment, head, server, model, workers)
                    figures[label].append(float(answer["seconds"]))  # type: ignore[arg-type]
                    routed[label] = answer["rollout_hosts"]  # type: ignore[assignment]
        finally:
            deployment.close()
    result = {
        "rollouts_per_round": 16,
        "median_seconds": {label: statistics.median(v) for label, v in figures.items()},
        "seconds": figures,
        "rollout_hosts": routed,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
