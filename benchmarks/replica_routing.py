"""Replica routing: multi-turn rollouts through one `art-server` on 1 or 2 torch-engine replicas.

Three configurations of the same server (a child process on 127.0.0.1, SmolLM2-135M-Instruct by
default, float32), started one after the other:

1. one replica (`--replicas 1`, no replica set: today's server);
2. two replicas, `--routing sticky`: a rollout's turns on one replica, new rollouts to the one
   with the fewest rows in flight;
3. two replicas, `--routing random`: every turn to a replica drawn at random.

Workload: R concurrent rollouts of T turns each, every turn on the rollout-scoped URL
(`/rollouts/<id>/v1`), temperature 1, `max_tokens` M (lengths are not forced: tokens/s counts the
completion tokens `usage` reports). Timed from the first send to the last answer; repeated, the
median reported. Beside throughput, the server's own counters: requests per replica, and prefix
reuse, the share of follow-up turns' prompt tokens whose previous turn's prompt was served on the
same replica (what a prefix cache such as vLLM's could reuse; the torch engine keeps no cache
between requests, so here it costs or gains nothing by itself). The CPU used by other processes
during each run is recorded beside it (the machine is shared).

    .venv/bin/python benchmarks/replica_routing.py [--rollouts 16] [--turns 3] [--max-tokens 24]
        [--repeats 2] [--model smollm2-135m-instruct | tiny]

Writes benchmarks/results/replica_routing.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import OtherLoad, machine_info
from _serve_processes import free_port, stop_process_group, wait_healthy
from _tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "replica_routing.json"
CONFIGURATIONS = [("1 replica", 1, "sticky"), ("2 sticky", 2, "sticky"), ("2 random", 2, "random")]
QUESTIONS = [
    "Name a fruit and say why you like it.", "Describe the sea in one sentence.",
    "What makes a good friend?", "Explain rain to a child.", "Give a tip for learning to cook.",
    "Why do cats purr?", "Describe a quiet morning.", "What is a library for?",
]  # fmt: skip


def server_command(model: str, replicas: int, routing: str, port: int, art_path: Path) -> list[str]:
    return [
        str(ROOT / ".venv" / "bin" / "art-server"),
        *("--model", model, "--name", "bench", "--dtype", "float32", "--engine", "torch"),
        *("--replicas", str(replicas), "--routing", routing),
        *("--port", str(port), "--path", str(art_path), "--log-level", "warning"),
    ]


def read_metrics(text: str) -> dict[str, float]:
    pairs = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


async def one_rollout(base_url: str, index: int, turns: int, max_tokens: int) -> int:
    """A conversation of `turns` turns on its rollout URL; returns the completion tokens."""
    import openai

    rollout_url = f"{base_url}/rollouts/bench-{uuid.uuid4().hex[:10]}/v1"
    client = openai.AsyncOpenAI(base_url=rollout_url, api_key="unused", max_retries=0)
    messages: list[dict[str, str]] = [
        {"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}
    ]
    tokens = 0
    try:
        for _ in range(turns):
            response = await client.chat.completions.create(
                model="bench",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=1.0,
            )
            assert response.usage is not None
            tokens += response.usage.completion_tokens
            messages += [
                {"role": "assistant", "content": response.choices[0].message.content or ""},
                {"role": "user", "content": "Say more about that."},
            ]
    finally:
        await client.close()
    return tokens


async def measure(
    model: str, replicas: int, routing: str, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """Start the server, warm it up, run the workload `args.repeats` times, stop it."""
    import httpx

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = work / f"server-{replicas}-{routing}.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            server_command(model, replicas, routing, port, work / f"art-{replicas}-{routing}"),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        startup = await wait_healthy(base_url, process, log)
        await one_rollout(base_url, 0, 1, 4)  # warm-up
        runs = []
        for _ in range(args.repeats):
            before = read_metrics(httpx.get(f"{base_url}/metrics").text)
            with OtherLoad() as load:
                started = time.perf_counter()
                tokens = await asyncio.gather(
                    *(
                        one_rollout(base_url, i, args.turns, args.max_tokens)
                        for i in range(args.rollouts)
                    )
                )
                wall = time.perf_counter() - started
            after = read_metrics(httpx.get(f"{base_url}/metrics").text)
            grown = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith("art_")}
            runs.append(run_result(sum(tokens), wall, load.cores, grown, replicas))
        return {
            "replicas": replicas,
            "routing": routing if replicas > 1 else None,
            "startup_seconds": round(startup, 2),
            "runs": runs,
            "tokens_per_second_median": round(
                statistics.median(r["tokens_per_second"] for r in runs), 1
            ),
            "other_load_cores_max": max(r["other_load_cores"] for r in runs),
        }
    finally:
        stop_process_group(process)


def run_result(
    tokens: int, wall: float, other_cores: float, grown: dict[str, float], replicas: int
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "completion_tokens": tokens,
        "wall_seconds": round(wall, 2),
        "tokens_per_second": round(tokens / wall, 1),
        "other_load_cores": round(other_cores, 2),
    }
    if replicas > 1:
        follow_ups = grown["art_replica_follow_up_turns_total"]
        prompt_tokens = grown["art_replica_follow_up_prompt_tokens_total"]
        result["requests_per_replica"] = [
            int(grown[f'art_replica_requests_routed_total{{replica="{i}"}}'])
            for i in range(replicas)
        ]
        result["follow_up_turns_on_same_replica"] = round(
            grown["art_replica_follow_up_same_replica_total"] / max(follow_ups, 1), 3
        )
        result["prefix_reuse"] = round(
            grown["art_replica_reusable_prefix_tokens_total"] / max(prompt_tokens, 1), 3
        )
    else:  # one replica: every follow-up turn meets its previous prompt there (no set counts it)
        result["requests_per_replica"] = [int(grown["art_requests_total"])]
    return result


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'configuration':<14} {'tok/s':>8} {'per replica':>14} {'same':>6} {'reuse':>6} load")
    for (label, _, _), result in zip(CONFIGURATIONS, results, strict=True):
        last = result["runs"][-1]
        print(
            f"{label:<14} {result['tokens_per_second_median']:>8} "
            f"{last['requests_per_replica']!s:>14} "
            f"{last.get('follow_up_turns_on_same_replica', 'all'):>6} "
            f"{last.get('prefix_reuse', '-'):>6} {result['other_load_cores_max']}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="or `tiny`")
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replica-routing-") as folder:
        work = Path(folder)
        model = args.model
        if model == "tiny":
            model = str(build_tiny_model(work / "tiny"))
        results = []
        for label, replicas, routing in CONFIGURATIONS:
            print(f"running {label} ...", flush=True)
            results.append(await measure(model, replicas, routing, args, work))
    print_table(results)
    if args.no_write:
        return
    report = {
        "machine": machine_info("torch", "transformers", load_average=os.getloadavg()),
        "workload": {
            "model": args.model,
            "rollouts": args.rollouts,
            "turns": args.turns,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
        },
        "results": {
            label: result for (label, _, _), result in zip(CONFIGURATIONS, results, strict=True)
        },
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
