"""Measuring one server: start it, time each model it serves (warm-up, streamed singles,
concurrent runs repeated while the machine is contended), read its metrics, always stop it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _serve_options as options
from _serve_options import child_env, contended_above
from _serve_processes import (
    BusyLoad,
    RssSampler,
    other_load,
    stop_process_group,
    tail,
    wait_for_quiet,
    wait_healthy,
)
from _serve_requests import PROMPTS, SINGLE_PROMPT, concurrent_run, one_request, streamed_run
from _serve_settings import REQUEST_TIMEOUT, ROOT


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
    busy = BusyLoad(options.BUSY)
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
