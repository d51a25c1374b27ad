"""Engine replicas on other hosts against one server alone, across network namespaces (root only).

Three namespace hosts (tests/support/netns.py) deployed as docs/cluster.md tells a user:
`art-server --replica-api` on b and c, and on a the server the agents call, alone or with
`--replica-url` b and c, routing `sticky` or `random`. From host a, `--chats` multi-turn chats
(`tests.netns._chat_driver`, each turn seeing the ones before) run `--concurrency` at a time; the
figure is chats' turns per second, medians over repetitions, with where the turns ran and how
many follow-up turns met their rollout's previous replica. The hosts share this machine's cores,
so the figure says what routing across real network stacks costs and does, not how replicas
scale on separate machines.

    sudo .venv/bin/python benchmarks/netns_replicas.py [--model FOLDER] [--repetitions 2]

Writes its figures into benchmarks/results/netns_replicas.json under the model's folder name
("tiny" for the tiny one), with the load average (other work included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "backend")]

from tests.netns._deployment import API_KEY, BIN, Deployment, answer_of  # noqa: E402
from tests.support import netns  # noqa: E402
from tests.support.tiny_model import build_tiny_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "netns_replicas.json"
SETUPS = (("a alone", "sticky", False), ("a + b + c, sticky", "sticky", True),
          ("a + b + c, random", "random", True))  # fmt: skip


def run_chats(deployment: Deployment, front: str, spec: dict[str, Any]) -> dict[str, Any]:
    a = deployment.network.hosts[0]
    body = json.dumps({"server": front, "key": API_KEY, **spec})
    result = deployment.network.run(
        a, [str(BIN / "python"), "-m", "tests.netns._chat_driver", body],
        env=deployment.env(a), timeout=900, check=False,
    )  # fmt: skip
    answer = answer_of(result.stdout, result.stderr)
    if "crashed" in answer or answer["failed"]:
        raise RuntimeError(json.dumps(answer)[:3000])
    return answer


def main() -> None:
    """Measure each setup and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, help="a model folder (default: a tiny random one)")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--chats", type=int, default=24)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    if reason := netns.unavailable():
        sys.exit(reason)
    netns.sweep_leftovers()
    load_before = os.getloadavg()
    spec = {"count": args.chats, "turns": args.turns, "concurrency": args.concurrency,
            "max_tokens": args.max_tokens}  # fmt: skip
    figures: dict[str, list[float]] = {label: [] for label, _, _ in SETUPS}
    last: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="nsr-", dir="/tmp") as root,
        netns.network(3) as network,
    ):
        model = args.model or build_tiny_model(Path(root) / "model")
        deployment = Deployment(network, Path(root), token="r" * 32, logs=Path(root))
        try:
            a, b, c = network.hosts
            urls = [deployment.start_server(h, model, "--replica-api", wait=False) for h in (b, c)]
            for url, host in zip(urls, (b, c), strict=True):
                deployment.wait_healthy(host, url)
            for _ in range(args.repetitions):
                for label, routing, remote in SETUPS:
                    extra = [x for url in urls for x in ("--replica-url", url)] if remote else []
                    front = deployment.start_server(a, model, "--routing", routing, *extra)
                    answer = run_chats(deployment, front, spec)
                    deployment.network.kill_host(a)  # the front goes; b and c serve on
                    figures[label].append(args.chats * args.turns / float(answer["seconds"]))
                    last[label] = answer
        finally:
            deployment.close()
    result = {
        "model": str(args.model or "tiny random (tests/support/tiny_model.py)"),
        "chats": spec,
        "median_turns_per_second": {label: statistics.median(v) for label, v in figures.items()},
        "turns_per_second": figures,
        "requests_routed": {
            label: [r["requests_routed"] for r in answer["replicas"]]
            for label, answer in last.items()
        },
        "follow_up_turns": {label: answer["routing"] for label, answer in last.items()},
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.model.name if args.model else "tiny"] = result  # one entry per model
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
