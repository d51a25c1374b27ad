"""The offline contender: batched greedy `model.generate()` of the same prompts in one
left-padded batch (the ceiling), run in a child process of serve_throughput.py
(`--offline-worker`)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _serve_options as options
from _serve_measure import annotate_run
from _serve_options import child_env
from _serve_processes import BusyLoad, RssSampler, stop_process_group, wait_for_quiet
from _serve_requests import PROMPTS, chat_messages
from _serve_settings import REQUEST_TIMEOUT, ROOT


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
        folder, dtype=getattr(torch, options.DTYPE), local_files_only=True
    ).eval()
    texts = [
        tokenizer.apply_chat_template(chat_messages(p), add_generation_prompt=True, tokenize=False)
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
    busy = BusyLoad(options.BUSY)
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
        str(Path(__file__).resolve().with_name("serve_throughput.py")),
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
        options.DTYPE,
        "--busy",
        str(options.BUSY),
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
