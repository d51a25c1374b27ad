"""The command line of a benchmark that measures contenders in turns in one process, on
SmolLM2-135M-Instruct or on the test suite's tiny random model (`--shape tiny`: for the test of
the JSON's keys; its figures mean nothing, and nothing is published)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from _machine import machine_info
from _markdown import publish

Measure = Callable[[str, str, dict[str, int], int], dict[str, Any]]


def run_in_turns(
    argv: list[str] | None,
    script: ModuleType,
    *,
    dtypes: str,
    packages: tuple[str, ...] = ("torch",),
    tiny_setup: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Parse `--dtypes --runs --shape --out`, run the script's `measure(model_dir, dtype, shape,
    runs)` on each dtype, and write its JSON (`RESULTS`) and, on SmolLM2, its `section` of
    BENCHMARKS.md between `START` and `END`; `SHAPES` names the workloads."""
    shapes: dict[str, dict[str, int]] = script.SHAPES
    measure: Measure = script.measure
    section: Callable[[dict[str, Any]], str] = script.section
    description = (script.__doc__ or "").split("\n\n")[0]
    results, markers = script.RESULTS, (script.START, script.END)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dtypes", default=dtypes)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--shape", choices=sorted(shapes), default="smollm2")
    parser.add_argument("--out", type=Path, default=results)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        if args.shape == "tiny":
            from tests.support.tiny_model import build_tiny_model

            if tiny_setup is not None:
                tiny_setup()
            model_dir, runs = str(build_tiny_model(Path(scratch) / "tiny")), 1
        else:
            from art_backend.engines._loading import ensure_default_model

            model_dir, runs = str(ensure_default_model()), args.runs
        shape = shapes[args.shape]
        figures = [measure(model_dir, d, shape, runs) for d in args.dtypes.split(",")]
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(*packages, torch_threads=torch.get_num_threads()),
        "model": Path(model_dir).name if args.shape == "smollm2" else "tiny",
        "workload": shape,
        "runs": runs,
        "figures": figures,
    }
    if args.shape == "tiny":
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(section(result))
    else:
        publish(result, args.out, *markers, section(result))
    return result
