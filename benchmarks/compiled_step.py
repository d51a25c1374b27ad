"""The compiled decode step against the eager one and batched `generate()`, SmolLM2-135M.

    .venv/bin/python benchmarks/compiled_step.py [--repeats 3] [--dtypes float32,bfloat16]

`family_throughput.py`'s workload (16 concurrent requests, prompts of 20-120 tokens, 64 sampled
tokens each, no end token) served by our torch engine with `ART_DECODE_STEP=dynamic` (the
default) and `ART_DECODE_STEP=compiled` (`engines/_compiled_step.py`), and by one left-padded
`generate()` as the peer; each measurement in a process of its own, the three alternating,
medians of `--repeats`. A compiled child serves the whole batch once first, which compiles
every shape the measured run meets (its seconds are the `first run` column; inductor's cache on
disk makes a later process's compile shorter), then the measured run. In bf16 both of ours run
with `ART_BATCH_INVARIANT=0`: the compiled step is refused with the batch-invariant attention
(its fused kernels would round otherwise than the trainer's), so bf16 here is not what
`art-server` serves by default (the family_throughput bf16 table is).

Writes benchmarks/results/compiled_step.json and its BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _machine import OtherLoad, machine_info
from _markdown import publish

RESULTS = Path(__file__).resolve().parent / "results" / "compiled_step.json"
START, END = "<!-- compiled_step:start -->", "<!-- compiled_step:end -->"
CONTENDERS = ("dynamic", "compiled", "generate")


def child(contender: str, dtype: str) -> None:
    """Print `first-run seconds` and `tokens/s` of one contender."""
    from family_throughput import measure_generate, measure_ours, prompts
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from art_backend.engines._loading import ensure_default_model

    folder = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    batch = prompts(model.config.vocab_size)
    started = time.perf_counter()
    if contender == "generate":
        measure_generate(model, batch[:2])
        first = time.perf_counter() - started
        rate = measure_generate(model, batch)
    else:  # the whole batch first: a compiled step meets every shape of the measured run
        measure_ours(model, tokenizer, batch)
        first = time.perf_counter() - started
        rate = measure_ours(model, tokenizer, batch)
    print(f"{first} {rate}")


def measure(contender: str, dtype: str) -> tuple[float, float]:
    environment = dict(os.environ)
    if contender != "generate":
        environment["ART_DECODE_STEP"] = contender
        if dtype != "float32":
            environment["ART_BATCH_INVARIANT"] = "0"
    command = [sys.executable, __file__, "--child", contender, "--dtypes", dtype]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        raise RuntimeError(f"{contender} in {dtype} failed:\n{done.stderr[-3000:]}")
    first, rate = done.stdout.strip().splitlines()[-1].split()
    return float(first), float(rate)


def bench(dtype: str, repeats: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    first: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    cores: list[float] = []
    for _ in range(repeats):
        for contender in CONTENDERS:
            with OtherLoad() as load:
                seconds, rate = measure(contender, dtype)
            runs[contender].append(round(rate, 2))
            first[contender].append(round(seconds, 2))
            cores.append(load.cores)
    rate = {name: statistics.median(values) for name, values in runs.items()}
    result = {
        "dtype": dtype,
        "tokens_per_s": {name: round(value, 1) for name, value in rate.items()},
        "compiled_over_dynamic": round(rate["compiled"] / rate["dynamic"], 3),
        "compiled_over_generate": round(rate["compiled"] / rate["generate"], 3),
        "dynamic_over_generate": round(rate["dynamic"] / rate["generate"], 3),
        "first_run_seconds": {name: max(values) for name, values in first.items()},
        "other_cores_max": round(max(cores), 2),
        "runs": runs,
    }
    print(result, flush=True)
    return result


def section(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = [
        START,
        "## The compiled decode step (`benchmarks/compiled_step.py`)",
        "",
        f"Measured {machine['date']} on {machine['cpu_count']} cores ({machine['cpu_model']}), "
        "SmolLM2-135M, 16 concurrent requests x 64 sampled tokens (family_throughput's "
        f"workload); medians of {result['repeats']} runs, each in a process of its own. "
        "`first run`: the slowest first serving of the batch (a compiled child compiles there).",
        "",
        "| dtype | dynamic tok/s | compiled tok/s | `generate()` tok/s | compiled / dynamic "
        "| compiled / generate | first run, compiled (s) | other cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["dtypes"]:
        rate = row["tokens_per_s"]
        lines.append(
            f"| {row['dtype']} | {rate['dynamic']} | {rate['compiled']} | {rate['generate']} "
            f"| {row['compiled_over_dynamic']}x | {row['compiled_over_generate']}x "
            f"| {row['first_run_seconds']['compiled']} | {row['other_cores_max']} |"
        )
    lines += [
        "",
        "In bf16 both layouts of ours run with `ART_BATCH_INVARIANT=0` (see the script's "
        "docstring): not the default served bf16.",
        END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.dtypes)
        return
    result = {
        "machine": machine_info("torch", "transformers"),
        "repeats": args.repeats,
        "dtypes": [bench(dtype, args.repeats) for dtype in args.dtypes.split(",")],
    }
    publish(result, RESULTS, START, END, section(result))


if __name__ == "__main__":
    main()
