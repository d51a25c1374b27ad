"""MCP rollouts per minute, and where a rollout's time goes: the policy, the server, our code.

The example inventory server (`examples/mcp_servers/inventory_server.py`) in six
configurations: stdio and streamable HTTP, each with a new MCP session per rollout
(`pool_size=0`), a pool of 4 sessions and a pool of 16 (as many as rollouts in a batch). The
policy is the test suite's scripted OpenAI-compatible server (`tests/support/scripted_judge.py`,
real HTTP on 127.0.0.1, in a process of its own) playing a fixed policy: search_items,
get_item, low_stock_report, complete_task (3 tool calls and 4 policy calls a rollout). Two
policies: an instant one (our share of the time is as large as it gets) and one that waits
0.5 s before each reply (a stand-in for a small model's turn; it sleeps, it uses no CPU).

Runs: batches of 16 concurrent `art_mcp.rollout`s (both policies) and, with the instant
policy, 16 rollouts one at a time (each rollout has the machine: the cleanest attribution).
Configurations are interleaved run by run (the order rotates every repetition); medians over
the repetitions.

Where the time goes, per rollout:
- policy: the policy's HTTP calls as the rollout sees them (`chat.completions.create`);
- server: the tool calls timed inside the server process (`MCPServer.call_tool`: argument
  validation, the tool, result conversion; `benchmarks/_timed_inventory_server.py`);
- transport: our client's time in tool calls (`tool_seconds`) minus the server's;
- session: opening and closing the rollout's session (`pool_size=0`: over stdio, starting and
  stopping a server process), or borrowing and returning a pooled one;
- rest: our loop (messages, tool dispatch, the trajectory) and waiting for the event loop.
Our overhead = rollout time - policy - server (target: under 10% of the rollout time). Time
queued for a pooled session (more rollouts than sessions) is other rollouts' work: reported,
and left out of the rollout time. One at a time, the CPU time of this process is split the
same way (the openai client in the policy calls, the MCP client in the tool calls, ...), and
our wrapper around a tool call is timed against the SDK's bare `client.call_tool`.

    .venv/bin/python benchmarks/mcp_rollouts.py [--repetitions 5] [--slow-policy-delay 0.5]
    .venv/bin/python benchmarks/mcp_rollouts.py --from-results   # the section again, no runs

Writes benchmarks/results/mcp_rollouts.json and its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import machine_info
from _markdown import publish
from _mcp_report import END, START, markdown
from _scripted_policy import POLICY_CALLS_PER_ROLLOUT, TOOL_CALLS_PER_ROLLOUT, TURNS

import art_core as art
import art_mcp
from art_mcp import McpServer, McpSession
from examples.mcp_servers.inventory_server import HTTP_PATH
from tests.support.processes import stop_process, wait_until_listening

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "mcp_rollouts.json"
POLICY_SCRIPT = ROOT / "benchmarks" / "_scripted_policy.py"
SERVER_SCRIPT = ROOT / "benchmarks" / "_timed_inventory_server.py"
MAX_TURNS = 6
ROLLOUTS_PER_RUN = 16
WRAPPER_ROUNDS = 60  # rounds of the 3 tool calls a repetition, for our wrapper's cost
RUNS = [  # (policy, concurrency): the runs of every configuration in a repetition
    ("instant", ROLLOUTS_PER_RUN),
    ("instant", 1),
    ("slow", ROLLOUTS_PER_RUN),
]
PARTS = ["policy", "tools", "acquire", "opening", "release"]


def run_key(policy: str, concurrency: int) -> str:
    return f"{policy}-x{concurrency}"


# ---------------------------------------------------------------------- per-rollout stopwatches


@dataclass
class Stopwatch:
    """Wall and CPU seconds one rollout spent in each part, added by the wrappers below."""

    wall: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    policy_calls: int = 0

    def add(self, part: str, wall_started: float, cpu_started: float) -> None:
        self.wall[part] += time.perf_counter() - wall_started
        self.cpu[part] += time.process_time() - cpu_started


_stopwatch: contextvars.ContextVar[Stopwatch | None] = contextvars.ContextVar(
    "stopwatch", default=None
)


def install_stopwatches() -> None:
    """Wrap the policy call, the tool call and the session's open/borrow/close so that they add
    to the running rollout's stopwatch (a context variable: each rollout is a task of its own).
    CPU deltas are exact only when one rollout runs at a time."""
    from openai.resources.chat.completions import AsyncCompletions

    def timed(function: Any, part: str) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            watch = _stopwatch.get()
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return await function(*args, **kwargs)
            finally:
                if watch is not None:
                    watch.add(part, wall, cpu)
                    watch.policy_calls += part == "policy"

        return wrapper

    AsyncCompletions.create = timed(AsyncCompletions.create, "policy")  # type: ignore[method-assign]
    McpSession.call_tool = timed(McpSession.call_tool, "tools")  # type: ignore[method-assign]
    McpSession.open = classmethod(timed(McpSession.open.__func__, "opening"))  # type: ignore[method-assign, assignment, attr-defined]
    session = McpServer.session

    @contextlib.asynccontextmanager
    async def timed_session(self: McpServer) -> AsyncIterator[McpSession]:
        watch = _stopwatch.get()
        wall, cpu = time.perf_counter(), time.process_time()
        async with session(self) as live:
            if watch is not None:
                watch.add("acquire", wall, cpu)
            try:
                yield live
            finally:
                wall, cpu = time.perf_counter(), time.process_time()
        if watch is not None:
            watch.add("release", wall, cpu)

    McpServer.session = timed_session  # type: ignore[method-assign, assignment]


# ----------------------------------------------------------------------------- the processes


class ServerTimings:
    """The tool-call seconds the server processes appended to one file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()
        self._offset = 0

    def read_new(self) -> list[float]:
        with self.path.open("rb") as file:
            file.seek(self._offset)
            data = file.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [float(line) for line in complete.split()]


class CpuMeter:
    """CPU seconds of this process, the policy processes, the MCP server processes (live
    children, and exited ones through this process's children times) and everyone else."""

    def __init__(self, policy_pids: set[int]) -> None:
        self.me = psutil.Process()
        self.policy_pids = policy_pids

    def mark(self) -> dict[str, float]:
        mine = self.me.cpu_times()
        marks = {
            "wall": time.perf_counter(),
            "client": mine.user + mine.system,
            "policy": 0.0,
            "server": mine.children_user + mine.children_system,  # exited stdio servers
        }
        for child in self.me.children():
            with contextlib.suppress(psutil.Error):
                cpu = child.cpu_times()
                part = "policy" if child.pid in self.policy_pids else "server"
                marks[part] += cpu.user + cpu.system
        machine = psutil.cpu_times()
        marks["machine"] = sum(
            getattr(machine, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq")
        )
        return marks

    @staticmethod
    def delta(start: dict[str, float], end: dict[str, float]) -> dict[str, float]:
        spent = {k: end[k] - start[k] for k in start}
        ours = spent["client"] + spent["policy"] + spent["server"]
        spent["other_load_cores"] = max(0.0, spent["machine"] - ours) / spent["wall"]
        return spent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_policy(delay: float) -> tuple[subprocess.Popen[str], str]:
    """The scripted policy in its own process; its base URL."""
    process = subprocess.Popen(
        [sys.executable, str(POLICY_SCRIPT), "--delay", str(delay)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http"):
        process.kill()
        raise RuntimeError("the scripted policy did not start")
    return process, url


def start_http_server(timings: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The timed inventory server over streamable HTTP in its own process; its URL."""
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), str(timings), "--http", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    wait_until_listening(process, port, log_path)
    return process, f"http://127.0.0.1:{port}{HTTP_PATH}"


# ------------------------------------------------------------------------------------ the runs


@dataclass
class Contender:
    """One configuration: its McpServer, the file its server processes log tool times to, and
    its runs by kind (`run_key`)."""

    key: str
    transport: str
    pool_size: int
    server: McpServer
    timings: ServerTimings
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


async def one_rollout(model: art.Model, server: McpServer, index: int) -> dict[str, Any]:
    watch = Stopwatch()
    token = _stopwatch.set(watch)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        trajectory = await art_mcp.rollout(
            model, server, f"Task {index}: which coffees are running low?", max_turns=MAX_TURNS
        )
    finally:
        _stopwatch.reset(token)
    metrics = trajectory.metrics
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "tool_seconds": float(metrics["tool_seconds"]),
        "parts_wall": watch.wall,
        "parts_cpu": watch.cpu,
        "ok": bool(metrics["task_completed"])
        and metrics["tool_calls"] == TOOL_CALLS_PER_ROLLOUT
        and metrics["tool_errors"] == 0
        and watch.policy_calls == POLICY_CALLS_PER_ROLLOUT,
    }


async def run(
    contender: Contender, model: art.Model, concurrency: int, meter: CpuMeter
) -> dict[str, Any]:
    """ROLLOUTS_PER_RUN rollouts, all at once or one at a time; the parts per rollout (ms)."""
    contender.timings.read_new()  # drop anything logged before
    mark = meter.mark()
    if concurrency == 1:
        rollouts = [await one_rollout(model, contender.server, k) for k in range(ROLLOUTS_PER_RUN)]
    else:
        batch = [one_rollout(model, contender.server, k) for k in range(concurrency)]
        rollouts = list(await asyncio.gather(*batch))
    cpu = CpuMeter.delta(mark, meter.mark())
    server_side = contender.timings.read_new()
    n = len(rollouts)

    def total(part: str, clock: str = "parts_wall") -> float:
        return sum(r[clock][part] for r in rollouts)

    queued = total("acquire") - total("opening") if contender.pool_size else 0.0
    session = total("acquire") + total("release") - queued
    rollout_time = sum(r["wall"] for r in rollouts) - queued
    tools, server = sum(r["tool_seconds"] for r in rollouts), sum(server_side)
    overhead = rollout_time - total("policy") - server
    result: dict[str, Any] = {
        "rollouts": n,
        "failed": sum(not r["ok"] for r in rollouts),
        "server_calls": len(server_side),
        "seconds": cpu["wall"],
        "rollouts_per_minute": n / cpu["wall"] * 60,
        "ms_per_rollout": {
            "rollout": rollout_time / n * 1000,
            "policy": total("policy") / n * 1000,
            "server": server / n * 1000,
            "transport": (tools - server) / n * 1000,
            "session": session / n * 1000,
            "session_open": (total("acquire") - queued) / n * 1000,
            "session_close": total("release") / n * 1000,
            "rest": (rollout_time - total("policy") - tools - session) / n * 1000,
            "overhead": overhead / n * 1000,
            "queued_for_session": queued / n * 1000,
        },
        "overhead_share": overhead / rollout_time,
        "cpu_ms_per_rollout": {k: cpu[k] / n * 1000 for k in ("client", "policy", "server")},
        "other_load_cores": cpu["other_load_cores"],
    }
    if concurrency == 1:  # this process's CPU, split by part (exact: one rollout at a time)
        client = sum(r["cpu"] for r in rollouts)
        parts = {
            "openai_client": total("policy", "parts_cpu"),
            "tool_calls": total("tools", "parts_cpu"),
            "session": total("acquire", "parts_cpu") + total("release", "parts_cpu"),
        }
        parts["rest"] = client - sum(parts.values())
        result["client_cpu_ms_per_rollout"] = {k: v / n * 1000 for k, v in parts.items()}
    return result


async def wrapper_cost(contender: Contender) -> dict[str, list[float]]:
    """CPU seconds of the 3 tool calls, WRAPPER_ROUNDS times each way, alternating: through
    `McpSession.call_tool` (our request hop to the session's task, result_text) and the SDK's
    `client.call_tool` run directly in that task."""
    server = contender.server
    tools = {tool.name: tool for tool in await server.list_tools()}
    ours, sdk = [], []
    async with server.session() as session:

        async def bare(client: Any) -> float:
            started = time.process_time()
            for name, arguments in TURNS:
                await client.call_tool(name, arguments)
            return time.process_time() - started

        async def wrapped() -> float:
            started = time.process_time()
            for name, arguments in TURNS:
                await session.call_tool(tools[name], arguments)
            return time.process_time() - started

        for round_ in range(WRAPPER_ROUNDS):
            if round_ % 2:
                sdk.append(await session.request(bare))
                ours.append(await wrapped())
            else:
                ours.append(await wrapped())
                sdk.append(await session.request(bare))
    return {"ours": ours, "sdk": sdk}


def build_contenders(http_url: str, http_timings: Path, work: Path) -> list[Contender]:
    contenders = []
    for transport in ("stdio", "http"):
        for pool_size in (0, 4, ROLLOUTS_PER_RUN):
            key = f"{transport}-{f'pool{pool_size}' if pool_size else 'new'}"
            if transport == "stdio":
                timings = ServerTimings(work / f"{key}-timings.txt")
                server = McpServer.from_command(
                    sys.executable, [str(SERVER_SCRIPT), str(timings.path)], pool_size=pool_size
                )
            else:
                timings = ServerTimings(http_timings)
                server = McpServer.from_url(http_url, pool_size=pool_size)
            contenders.append(Contender(key, transport, pool_size, server, timings))
    return contenders


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    install_stopwatches()
    instant, instant_url = start_policy(0.0)
    slow, slow_url = start_policy(args.slow_policy_delay)
    http_timings = work / "http-timings.txt"
    http, http_url = start_http_server(http_timings, work / "http-server.log")
    models = {
        "instant": art.Model(name="policy", base_url=instant_url, api_key="x"),
        "slow": art.Model(name="policy", base_url=slow_url, api_key="x"),
    }
    meter = CpuMeter({instant.pid, slow.pid})
    contenders = build_contenders(http_url, http_timings, work)
    wrapper_cpu: dict[str, dict[str, list[float]]] = {}
    try:
        for contender in contenders:
            # Warm-up: the tool list cached; the pools filled (a pool opens a session only when
            # none is free, so it fills under the slow policy, where every rollout holds one).
            await contender.server.list_tools()
            for policy in ("slow", "instant"):
                await run(contender, models[policy], ROLLOUTS_PER_RUN, meter)
            print(f"   warmed up {contender.key}", flush=True)
        for repetition in range(args.repetitions):
            shift = repetition % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                for policy, concurrency in RUNS[repetition % 3 :] + RUNS[: repetition % 3]:
                    result = await run(contender, models[policy], concurrency, meter)
                    contender.runs.setdefault(run_key(policy, concurrency), []).append(result)
                    ms = result["ms_per_rollout"]
                    print(
                        f"   {repetition + 1}/{args.repetitions} {contender.key:<12} "
                        f"{run_key(policy, concurrency):<11} {result['rollouts_per_minute']:7.0f}"
                        f"/min  rollout {ms['rollout']:7.1f} ms  policy {ms['policy']:6.1f}  "
                        f"server {ms['server']:5.2f}  overhead {ms['overhead']:6.1f} ms "
                        f"({result['overhead_share'] * 100:4.1f}%)  load "
                        f"{result['other_load_cores']:.2f}  failed {result['failed']}",
                        flush=True,
                    )
            for transport in ("stdio", "http"):  # our wrapper, on a pooled session
                pooled = next(c for c in contenders if c.key == f"{transport}-pool4")
                for way, seconds in (await wrapper_cost(pooled)).items():
                    wrapper_cpu.setdefault(transport, {}).setdefault(way, []).extend(seconds)
    finally:
        for contender in contenders:
            await contender.server.close()
        for process in (http, instant, slow):
            stop_process(process)
    return {
        "configs": {c.key: summarize(c) for c in contenders},
        "wrapper_cost": {
            transport: {
                f"{way}_us_per_call": round(statistics.median(seconds) * 1e6 / len(TURNS), 1)
                for way, seconds in ways.items()
            }
            | {"rounds": len(ways["ours"])}
            for transport, ways in wrapper_cpu.items()
        },
    }


def summarize(contender: Contender) -> dict[str, Any]:
    """Medians over the repetitions, for each kind of run."""

    def median(values: Any) -> float:
        return round(statistics.median(values), 4)

    def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "rollouts_per_minute": median(r["rollouts_per_minute"] for r in runs),
            "rollouts_per_minute_runs": [round(r["rollouts_per_minute"], 1) for r in runs],
            "overhead_share": median(r["overhead_share"] for r in runs),
            "overhead_share_runs": [round(r["overhead_share"], 4) for r in runs],
            "other_load_cores": median(r["other_load_cores"] for r in runs),
            "rollouts": sum(r["rollouts"] for r in runs),
            "failed": sum(r["failed"] for r in runs),
            "server_calls": sum(r["server_calls"] for r in runs),
        }
        for table in ("ms_per_rollout", "cpu_ms_per_rollout", "client_cpu_ms_per_rollout"):
            if table in runs[0]:
                summary[table] = {
                    part: median(r[table][part] for r in runs) for part in runs[0][table]
                }
        return summary

    return {
        "transport": contender.transport,
        "pool_size": contender.pool_size,
        "runs": {key: medians(runs) for key, runs in contender.runs.items()},
        "raw": contender.runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument(
        "--slow-policy-delay", type=float, default=0.5, help="seconds the slow policy waits"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the section, write nothing")
    parser.add_argument(
        "--from-results", action="store_true", help="rewrite the section from the saved results"
    )
    args = parser.parse_args()
    if args.from_results:
        report = json.loads(RESULTS.read_text())
        publish(report, RESULTS, START, END, markdown(report))
        return
    with tempfile.TemporaryDirectory(prefix="mcp-rollouts-") as work:
        measured = asyncio.run(measure(args, Path(work)))
    report = {
        "benchmark": "mcp_rollouts",
        "machine": machine_info("mcp", "openai", "httpx2", "uvicorn"),
        "settings": {
            "repetitions": args.repetitions,
            "rollouts_per_run": ROLLOUTS_PER_RUN,
            "slow_policy_delay_seconds": args.slow_policy_delay,
            "tool_calls_per_rollout": TOOL_CALLS_PER_ROLLOUT,
            "policy_calls_per_rollout": POLICY_CALLS_PER_ROLLOUT,
            "max_turns": MAX_TURNS,
        },
        **measured,
    }
    if args.dry_run:
        print(markdown(report))
        return
    publish(report, RESULTS, START, END, markdown(report))


if __name__ == "__main__":
    main()
