"""Soak: many real clients against one art-server; does it stay healthy, fast and small?

The tiny test model (`tests/support/tiny_model.py`, built on the spot) is served by `art-server` in a
child process on 127.0.0.1 (nothing leaves the machine), and the openai SDK (async) drives it:

1. steady load: N concurrent clients send short chat requests for T seconds. Reported:
   completed requests, 5xx, other errors, p50/p99 latency, the server's RSS before and after,
   the stored records (count and estimated bytes).
2. disconnect wave: W streaming clients start long generations and close after a few chunks.
   The server must then answer /health and its running rows must return to 0 (time reported).
3. one expensive request among others: while K clients keep sending short requests and a probe
   polls /health, one client sends an 8 MB message, then the largest JSON schema allowed
   (compiled, ~1 s), a body over the size limit, 6 million small JSON values, 9 MB of tool
   property names, and reads back five stored 3.8 MB records in one lookup; then the hostile
   shapes of issue 43: 28 MB of `\\",` escapes inside one string (to a chat and to a training
   route), a 32 MB history read back (`GET .../history`) and a 50,000-key `client_metrics`;
   then issue 50's hostile Tinker bodies: 6 million small values and 28 MB of escapes to
   create_session, and forward_backward protobufs with one 1.5M-token datum, a sparse tensor of
   2.5 million rows, and 400,000 one-token datums (a future's outcome is reported too).
   Reported per case: its answer and time,
   and the others' latency and the worst /health latency while it ran, beside the same figures
   just before it. A frozen event loop shows as a /health latency as long as the request.

    .venv/bin/python benchmarks/soak.py [--clients 16] [--seconds 60] [--wave 16] [--quick]

Writes benchmarks/results/soak.json and the soak section of BENCHMARKS.md (`--quick`: a short
run that prints and writes nothing unless `--write` is given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine_info
from _markdown import publish
from _soak_requests import (
    MIB,
    MODEL,
    REQUEST_TIMEOUT,
    Request,
    chat,
    expensive_requests,
    hostile_requests,
    post,
    settled,
    tinker_requests,
)
from _tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "soak.json"
START, END = "<!-- soak:start -->", "<!-- soak:end -->"
MAX_CLIENTS, MAX_SECONDS = 64, 600  # bounds on the flags: a soak, not a load generator


# ------------------------------------------------------------------------------------ server


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def rss_mb(self) -> float:
        return psutil.Process(self.process.pid).memory_info().rss / MIB

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        pairs = (line.split() for line in text.splitlines() if line and line[0] != "#")
        return {name: float(value) for name, value in pairs}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model_dir: Path, art_path: Path, log: Path) -> Server:
    """`art-server` on the tiny model, in its own session (stopped as a group), once healthy."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "art_backend.cli", "--model", str(model_dir), "--name", MODEL),
        *("--dtype", "float32", "--host", "127.0.0.1", "--port", str(port)),
        *("--path", str(art_path), "--log-level", "warning"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"art-server exited ({process.returncode}):\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        time.sleep(0.3)
    stop_server(server)
    raise TimeoutError(f"art-server was not healthy within 300 s:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(10)


def eos_token_id(model_dir: Path) -> int:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    return next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|im_end|>")


class MachineLoad:
    """CPU cores used by processes outside this benchmark (the machine is shared)."""

    def __init__(self, server_pid: int) -> None:
        self.server = psutil.Process(server_pid)
        self.me = psutil.Process()
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        busy = sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq"))
        ours = 0.0
        for process in (self.server, self.me):
            with contextlib.suppress(psutil.Error):
                cpu = process.cpu_times()
                ours += cpu.user + cpu.system + cpu.children_user + cpu.children_system
        return time.perf_counter(), busy, ours

    def other_cores(self) -> float:
        """Mean cores busy outside the server and this process since construction."""
        end = self._snapshot()
        wall = end[0] - self.start[0]
        return round(max(0.0, (end[1] - self.start[1]) - (end[2] - self.start[2])) / wall, 2)


# ----------------------------------------------------------------------------------- clients


@dataclass
class Tally:
    """What a group of clients saw: (start, end) of each answered request and the failures."""

    spans: list[tuple[float, float]] = field(default_factory=list)
    server_errors: int = 0  # 5xx
    client_errors: int = 0  # other 4xx
    connection_errors: int = 0

    def latencies(self, start: float = 0.0, end: float = float("inf")) -> list[float]:
        """Latencies of the requests that overlapped [start, end]."""
        return [b - a for a, b in self.spans if b >= start and a <= end]

    def latencies_within(self, start: float, end: float) -> list[float]:
        """Latencies of the requests that started and ended inside [start, end]."""
        return [b - a for a, b in self.spans if a >= start and b <= end]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_summary(values: list[float]) -> dict[str, Any]:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 1)

    return {
        "requests": len(values),
        "p50_ms": ms(percentile(values, 0.5)),
        "p99_ms": ms(percentile(values, 0.99)),
        "max_ms": ms(max(values) if values else None),
    }


async def short_requests(
    client: openai.AsyncOpenAI, tally: Tally, stop: asyncio.Event, max_tokens: int
) -> None:
    """One client: short chat requests back to back until `stop`."""
    while not stop.is_set():
        a, b = secrets.randbelow(90) + 10, secrets.randbelow(90) + 10
        started = time.perf_counter()
        try:
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"What is {a} + {b}?"}],
                max_tokens=max_tokens,
            )
            tally.spans.append((started, time.perf_counter()))
        except openai.APIStatusError as error:
            if error.status_code >= 500:
                tally.server_errors += 1
            else:
                tally.client_errors += 1
        except openai.APIConnectionError:
            tally.connection_errors += 1


async def health_probe(url: str, tally: Tally, stop: asyncio.Event) -> None:
    """GET /health every 20 ms: its latency is how long the event loop kept others waiting."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT) as http:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                response = await http.get(f"{url}/health")
                tally.spans.append((started, time.perf_counter()))
                if response.status_code >= 500:
                    tally.server_errors += 1
            except httpx.HTTPError:
                tally.connection_errors += 1
            await asyncio.sleep(0.02)


def new_client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT
    )


# ------------------------------------------------------------------------------------ phases


async def steady_load(server: Server, clients: int, seconds: float, max_tokens: int) -> dict:
    """N clients for T seconds; RSS and records before and after."""
    client, tally, stop = new_client(server), Tally(), asyncio.Event()
    rss_before, metrics_before = server.rss_mb, server.metrics()
    tasks = [
        asyncio.create_task(short_requests(client, tally, stop, max_tokens)) for _ in range(clients)
    ]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    await client.close()
    metrics = server.metrics()
    latencies = tally.latencies()
    return {
        "clients": clients,
        "seconds": seconds,
        "max_tokens": max_tokens,
        "completed": len(latencies),
        "requests_per_second": round(len(latencies) / seconds, 1),
        "server_errors_5xx": tally.server_errors,
        "client_errors_4xx": tally.client_errors,
        "connection_errors": tally.connection_errors,
        **{f"latency_{k}": v for k, v in latency_summary(latencies).items() if k != "requests"},
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_after": round(server.rss_mb, 1),
        "records_after": int(metrics["art_records"]),
        "records_mb_after": round(metrics.get("art_records_bytes", float("nan")) / MIB, 1),
        "record_evictions": int(
            metrics["art_record_evictions_total"] - metrics_before["art_record_evictions_total"]
        ),
        "server_failed_requests": int(
            metrics["art_requests_failed_total"] - metrics_before["art_requests_failed_total"]
        ),
    }


async def disconnect_wave(server: Server, streams: int, eos_id: int) -> dict:
    """W streaming clients that read a few chunks of a long generation, then hang up."""
    client = new_client(server)
    before = server.metrics()

    async def read_then_close() -> int:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a very long story."}],
            max_tokens=1500,
            logit_bias={str(eos_id): -100},  # no end-of-turn: it would run 1,500 tokens
            stream=True,
        )
        chunks = 0
        async for _ in stream:
            chunks += 1
            if chunks == 5:
                break
        await stream.close()
        return chunks

    read = await asyncio.gather(*(read_then_close() for _ in range(streams)))
    await client.close()
    hung_up = time.perf_counter()
    drained = None
    while time.perf_counter() - hung_up < 60:  # a bound on the wait, reported if reached
        metrics = server.metrics()
        if metrics["art_running_rows"] == 0 and metrics["art_queue_depth"] == 0:
            drained = time.perf_counter() - hung_up
            break
        await asyncio.sleep(0.05)
    metrics = server.metrics()
    health = httpx.get(f"{server.url}/health", timeout=30).status_code
    return {
        "streams": streams,
        "chunks_read_each": min(read),
        "running_rows_after": int(metrics["art_running_rows"]),
        "rows_drained_seconds": None if drained is None else round(drained, 2),
        "cancelled": int(
            metrics["art_requests_cancelled_total"] - before["art_requests_cancelled_total"]
        ),
        "health_after": health,
        "generated_tokens": int(
            metrics["art_generated_tokens_total"] - before["art_generated_tokens_total"]
        ),
    }


async def stored_big_records(server: Server, count: int = 5) -> list[str]:
    """Ids of `count` completions whose stored records are about 3.8 MB each (a long `user`)."""
    ids = []
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT) as http:
        for _ in range(count):
            body = chat(user="u" * (38 * MIB // 10))
            response = await http.post(f"{server.url}/v1/chat/completions", json=body)
            response.raise_for_status()
            ids.append(response.json()["id"])
    return ids


async def one_expensive_request(
    server: Server,
    label: str,
    request: Request,
    clients: int,
    max_tokens: int,
) -> dict:
    """K clients and a /health probe run; after a quiet baseline, one client sends `request`
    (built before the clients start: `_soak_requests.post`)."""
    client, others, probe, stop = new_client(server), Tally(), Tally(), asyncio.Event()
    tasks = [
        asyncio.create_task(short_requests(client, others, stop, max_tokens))
        for _ in range(clients)
    ]
    tasks.append(asyncio.create_task(health_probe(server.url, probe, stop)))
    await asyncio.sleep(5.0)  # the baseline window
    # Sent from a thread with a client of its own: reading a 32 MB answer on this event loop
    # would delay the probe here, and read as the server's latency.
    started = time.perf_counter()
    response = await asyncio.to_thread(
        httpx.request,
        request.method,
        f"{server.url}{request.path}",
        content=request.body or None,
        headers={"content-type": request.content_type},
        timeout=REQUEST_TIMEOUT,
    )
    ended = time.perf_counter()
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*tasks)
    await client.close()
    tinker = request.path.startswith("/api/v1/")
    answer = response.json() if tinker or response.status_code != 200 else {}
    error = answer.get("error")
    return {
        "request": label,
        "body_mb": round(len(request.body or response.content) / MIB, 1),
        "status": response.status_code,
        "param": error.get("param") if isinstance(error, dict) else None,
        "detail": str(answer.get("detail", ""))[:200] or None,  # the Tinker API's refusals
        "future": await asyncio.to_thread(future_outcome, server, answer),
        "seconds": round(ended - started, 3),
        "others_during": latency_summary(others.latencies(started, ended)),
        "others_before": latency_summary(others.latencies_within(started - 5.0, started)),
        "health_max_ms_during": latency_summary(probe.latencies(started, ended))["max_ms"],
        "health_p99_ms_during": latency_summary(probe.latencies(started, ended))["p99_ms"],
        "health_max_ms_before": latency_summary(probe.latencies_within(started - 5.0, started))[
            "max_ms"
        ],
        "server_errors_5xx": others.server_errors + probe.server_errors,
        "connection_errors": others.connection_errors + probe.connection_errors,
    }


def future_outcome(server: Server, answer: dict[str, Any]) -> str | None:
    """How a Tinker operation's future ended ("done", its failure's category and message, or
    "still running" after a minute); None for an answer that is no future."""
    if "request_id" not in answer:
        return None
    with httpx.Client(base_url=f"{server.url}/api/v1", timeout=REQUEST_TIMEOUT) as http:
        outcome = settled(http, answer["request_id"], wait=60.0)
    if "error" in outcome:
        return f"{outcome.get('category')}: {str(outcome['error'])[:200]}"
    return "still running" if outcome["type"] == "still running" else "done"


# ------------------------------------------------------------------------------------ report


def markdown(report: dict[str, Any]) -> str:
    machine, load, wave = report["machine"], report["steady_load"], report["disconnect_wave"]
    lines = [
        START,
        "## Soak: concurrent clients, disconnects, one expensive request (`benchmarks/soak.py`)",
        "",
        f"`art-server` on the tiny test model (`tests/support/tiny_model.py`, float32), a child process "
        f"on 127.0.0.1, driven by the openai SDK (async). Measured {machine['date']} on "
        f"{machine['cpu_count']} x {machine['cpu_model']}; other load (cores used outside the "
        f"benchmark, whole run): {report['other_load_cores']}, load average "
        f"{report['loadavg_before']} before, {report['loadavg_after']} after.",
        "",
        f"Steady load: {load['clients']} clients for {load['seconds']:.0f} s, "
        f"max_tokens {load['max_tokens']}.",
        "",
        "| completed | req/s | 5xx | other 4xx | connection errors | p50 (ms) | p99 (ms) "
        "| RSS before (MB) | RSS after (MB) | records kept | records (MB, estimated) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {load['completed']:,} | {load['requests_per_second']} | {load['server_errors_5xx']} "
        f"| {load['client_errors_4xx']} | {load['connection_errors']} | {load['latency_p50_ms']} "
        f"| {load['latency_p99_ms']} | {load['rss_mb_before']:.0f} | {load['rss_mb_after']:.0f} "
        f"| {load['records_after']:,} | {load['records_mb_after']} |",
        "",
        f"Disconnect wave: {wave['streams']} streaming clients (1,500-token generations) hang "
        f"up after {wave['chunks_read_each']} chunks: {wave['cancelled']} cancelled, running rows "
        f"back to {wave['running_rows_after']} in {wave['rows_drained_seconds']} s, /health "
        f"{wave['health_after']} after, {wave['generated_tokens']:,} tokens generated in all.",
        "",
        f"One expensive request while {report['phase3_clients']} clients send short requests "
        "and a probe polls /health every 20 ms (before: the 5 s just before it):",
        "",
        "| request | answer | its time (s) | others p50 / max during (ms) "
        "| others p50 / max before (ms) | /health p99 / worst during (ms) "
        "| worst /health before (ms) | 5xx |",
        "|---|---|---:|---|---|---:|---:|---:|",
    ]
    for case in report["expensive"]:
        during, before = case["others_during"], case["others_before"]
        answer = f"{case['status']}" + (f" `{case['param']}`" if case["param"] else "")
        if case.get("future"):  # a Tinker operation: how its future ended
            answer += f", future {case['future'].split(':')[0]}"
        lines.append(
            f"| {case['request']} | {answer} | {case['seconds']} "
            f"| {during['p50_ms']} / {during['max_ms']} | {before['p50_ms']} / {before['max_ms']} "
            f"| {case.get('health_p99_ms_during', '-')} / {case['health_max_ms_during']} "
            f"| {case['health_max_ms_before']} "
            f"| {case['server_errors_5xx']} |"
        )
    lines += [
        "",
        "A frozen event loop would show as a worst /health latency about as long as the "
        "request itself (the issue measured 12.2 s for an 8 MB message, 9.8 s for a "
        "10,000-property schema, before the limits; then 9 s for 6 million small values, "
        "16-25 s for a lookup of five 3.8 MB records, 34.5 s for 9 MB of tool property names, "
        "before the second hardening pass; then 0.7-1.3 s for 28 MB of escapes, 0.5 s for a "
        "32 MB history, 1.1 s for a 50,000-key client_metrics, before the third; on the "
        "Tinker routes, 0.75 s for 6 million small values, 0.38 s for 28 MB of escapes, "
        "0.55 s for a 1.5M-token datum, 6.2 s for 2.5M CSR rows and 39.5 s for 400,000 "
        "one-token datums, before they took the same door, issue 50). Target: /health p99 "
        "under 250 ms while each runs. "
        "Raw numbers: `benchmarks/results/soak.json`.",
        END,
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="art-soak-") as folder:
        model_dir = build_tiny_model(Path(folder) / "tiny")
        server = start_server(model_dir, Path(folder) / ".art", Path(folder) / "server.log")
        try:
            load = MachineLoad(server.process.pid)
            loadavg_before = round(os.getloadavg()[0], 2)
            # One request first: the first one pays for lazy initialisation.
            await new_client(server).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            print(f"steady load: {args.clients} clients, {args.seconds} s", flush=True)
            steady = await steady_load(server, args.clients, args.seconds, args.max_tokens)
            print(json.dumps(steady), flush=True)
            wave = await disconnect_wave(server, args.wave, eos_token_id(model_dir))
            print(json.dumps(wave), flush=True)
            expensive = []
            phase3_clients = min(args.clients, 8)
            requests: dict[str, Request] = {}
            if not args.hostile_only:
                requests.update(expensive_requests())
                lookup = {"ids": await stored_big_records(server)}
                requests["lookup of five 3.8 MB records"] = post(
                    "/v1/chat/completions/lookup", lookup
                )
            requests.update(hostile_requests(server.url, Path(folder) / ".art"))
            requests.update(tinker_requests(server.url))
            for label, request in requests.items():
                case = await one_expensive_request(
                    server, label, request, phase3_clients, args.max_tokens
                )
                print(json.dumps(case), flush=True)
                expensive.append(case)
            return {
                "benchmark": "soak",
                "machine": machine_info("torch", "transformers", "openai", "uvicorn"),
                "other_load_cores": load.other_cores(),
                "loadavg_before": loadavg_before,
                "loadavg_after": round(os.getloadavg()[0], 2),
                "steady_load": steady,
                "disconnect_wave": wave,
                "phase3_clients": phase3_clients,
                "expensive": expensive,
                "rss_mb_end": round(server.rss_mb, 1),
            }
        finally:
            stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16, help=f"1-{MAX_CLIENTS}")
    parser.add_argument("--seconds", type=float, default=60.0, help=f"1-{MAX_SECONDS}")
    parser.add_argument(
        "--wave", type=int, default=16, help=f"streams that hang up, 1-{MAX_CLIENTS}"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="4 clients, 10 s; writes nothing")
    parser.add_argument("--write", action="store_true", help="with --quick: write results too")
    parser.add_argument(
        "--hostile-only",
        action="store_true",
        help="of the expensive requests, only the hostile shapes of issues 43 and 50 (with --quick)",
    )
    args = parser.parse_args()
    if args.quick:
        args.clients, args.seconds, args.wave = 4, 10.0, 4
    if not (1 <= args.clients <= MAX_CLIENTS and 1 <= args.wave <= MAX_CLIENTS):
        parser.error(f"--clients and --wave must be 1-{MAX_CLIENTS}")
    if not 1 <= args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be 1-{MAX_SECONDS}")
    report = asyncio.run(run(args))
    if args.quick and not args.write:
        print(markdown(report))
        return
    publish(report, RESULTS, START, END, markdown(report))


if __name__ == "__main__":
    main()
