"""How far our decoding and training are from what this machine computes: the limit, measured.

    .venv/bin/python benchmarks/machine_limit.py [--repeats 3] [--shape smollm2|tiny] [--out PATH]
    .venv/bin/python benchmarks/machine_limit.py --publish results.json   # re-render, no run

In one run, on one thread count (torch's default, recorded): torch.mm on two 2048 x 2048
matrices, float32 and bf16, best of 10, measured first and last (the peak is the better of the
two: the machine is shared); our torch engine's decode step on SmolLM2-135M-Instruct at 16 and
64 rows x 64 sampled tokens (64-token prompts), float32 and bf16, beside a bare transformers
forward loop over its KV cache on the same prompts; the *linear floor* at those rows and dtypes
(the model's linear layers alone, each weight read once a pass, as a decode step reads them:
`_limit_figures.linear_floor`) and each decode step as a share of it; the trainer's
forward+backward on a GRPO step's rows (4 prompts x 4 completions, 64 + 64 tokens, LoRA r16 on q,k,v,o); each as a share
of its dtype's peak. Each figure runs in a process of its own (`family_throughput.py` says why)
and is the best of `--repeats` runs; `os.getloadavg()` and the cores other processes used are
recorded beside it. Then torch.profiler on decode steps (base model and through a LoRA adapter)
and on training steps: where the time goes, by bucket (`_op_profile.py`), and the top 20 ops.

FLOPs, two counts: *conventional* 2 x N per decoded token and 6 x N per trained token (N the
linear weights: every nn.Linear's, the tied LM head once; attention not counted); *counted*:
what torch's FlopCounterMode saw the step execute (every matmul, LoRA's, the LM head's, and
attention over every cache column, padding and causal-masked positions included).

`--shape tiny`: the test suite's tiny random model, small shapes, one run, in this process:
for the test of the JSON's keys; its figures mean nothing.

Writes benchmarks/results/machine_limit.json and its BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests/ (the tiny model)

from _machine import OtherLoad, machine_info

BENCHMARKS = Path(__file__).resolve().parent

RESULTS = BENCHMARKS / "results" / "machine_limit.json"
START, END = "<!-- machine_limit:start -->", "<!-- machine_limit:end -->"
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2": {
        "matmul_size": 2048, "matmul_repeats": 10, "rows": [16, 64], "prompt_tokens": 64,
        "new_tokens": 64, "groups": 4, "per_group": 4, "completion_tokens": 64,
        "profile_steps": 8, "train_profile_steps": 2,
    },
    "tiny": {
        "matmul_size": 128, "matmul_repeats": 2, "rows": [2, 4], "prompt_tokens": 8,
        "new_tokens": 4, "groups": 2, "per_group": 2, "completion_tokens": 4,
        "profile_steps": 1, "train_profile_steps": 1,
    },
}  # fmt: skip
DTYPES = ("float32", "bfloat16")


def measure(spec: dict[str, Any], in_process: bool) -> dict[str, Any]:
    """One figure, with the load around it: in a child process unless `in_process`."""
    before = os.getloadavg()
    with OtherLoad() as load:
        if in_process:
            from _limit_figures import run_figure

            result = run_figure(spec)
        else:
            command = [sys.executable, __file__, "--child", json.dumps(spec)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{spec} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
    result["loadavg_before"] = [round(v, 2) for v in before]
    result["loadavg_after"] = [round(v, 2) for v in os.getloadavg()]
    result["other_cores"] = round(load.cores, 2)
    keys = ("figure", "contender", "dtype", "rows", "adapter", "kernel")
    named = {k: spec[k] for k in keys if k in spec}
    shown = {k: v for k, v in result.items() if k != "profile"}
    print(json.dumps({**named, **shown}), flush=True)
    return result


def run(
    shape: str, model_dir: str, repeats: int, in_process: bool, threads: int | None = None
) -> dict[str, Any]:
    """Every figure of the benchmark on `threads` torch threads (None: torch's default)."""
    sizes = SHAPES[shape]
    peaks: dict[str, list[dict[str, Any]]] = {dtype: [] for dtype in DTYPES}

    def peak_pass() -> None:
        for dtype in DTYPES:
            spec = {"figure": "matmul", "dtype": dtype, "size": sizes["matmul_size"]}
            spec["threads"] = threads
            peaks[dtype].append(measure({**spec, "repeats": sizes["matmul_repeats"]}, in_process))

    peak_pass()
    workload = {k: v for k, v in sizes.items() if "profile" not in k and "matmul" not in k}
    common = {"model_dir": model_dir, "repeats": repeats, "threads": threads, **workload}
    decode = []
    for dtype in DTYPES:
        for rows in sizes["rows"]:
            for contender in ("ours", "hf"):
                spec = {"figure": "decode", "contender": contender, "dtype": dtype, "rows": rows}
                decode.append({**spec, **measure({**common, **spec}, in_process)})
    floors = []
    for kernel in ("dense", "packed"):
        for dtype in DTYPES:
            for rows in sizes["rows"]:
                spec = {"figure": "floor", "dtype": dtype, "rows": rows, "kernel": kernel}
                floors.append({**spec, **measure({**common, **spec}, in_process)})
    profiles: dict[str, Any] = {}
    rows = sizes["rows"][0]
    for adapter in (False, True):
        spec = {"figure": "decode", "contender": "ours", "dtype": "float32", "rows": rows}
        spec |= {"adapter": adapter, "profile_steps": sizes["profile_steps"]}
        figure = {**spec, **measure({**common, **spec}, in_process)}
        profiles["decode_lora" if adapter else "decode"] = figure.pop("profile")
        if adapter:
            decode.append(figure)
    train = []
    for dtype in DTYPES:
        spec = {"figure": "train", "dtype": dtype}
        if dtype == "float32":
            spec["profile_steps"] = sizes["train_profile_steps"]
        figure = {**spec, **measure({**common, **spec}, in_process)}
        if "profile" in figure:
            profiles["train"] = figure.pop("profile")
        train.append(figure)
    peak_pass()
    return assemble(shape, sizes, repeats, peaks, decode, train, profiles, floors)


def assemble(
    shape: str,
    sizes: dict[str, Any],
    repeats: int,
    peaks: dict[str, list[dict[str, Any]]],
    decode: list[dict[str, Any]],
    train: list[dict[str, Any]],
    profiles: dict[str, Any],
    floors: list[dict[str, Any]],
) -> dict[str, Any]:
    """The result JSON: the peaks, every figure as a share of its dtype's peak, each decode
    figure's step beside its linear floor, the profiles."""
    matmul_peak = {
        dtype: {
            "flops_per_s": max(p["flops_per_s"] for p in passes),
            "size": sizes["matmul_size"],
            "passes": passes,
        }
        for dtype, passes in peaks.items()
    }
    for figure in [*decode, *train]:
        peak = matmul_peak[figure["dtype"]]["flops_per_s"]
        figure["conventional_share_of_peak"] = figure["conventional_flops_per_s"] / peak
        figure["counted_share_of_peak"] = figure["counted_flops_per_s"] / peak
    for floor in floors:
        floor["share_of_peak"] = floor["flops_per_s"] / matmul_peak[floor["dtype"]]["flops_per_s"]
    for figure in decode:
        floor = next(  # the kernels the engine runs
            f
            for f in floors
            if (f["dtype"], f["rows"], f.get("kernel", "dense"))
            == (figure["dtype"], figure["rows"], "packed")
        )
        figure["step_s"] = figure["rows"] / figure["decode_tokens_per_s"]
        figure["linear_floor_s"] = floor["step_s"]
        figure["share_of_linear_floor"] = floor["step_s"] / figure["step_s"]
    every = [*decode, *train, *floors, *peaks["float32"], *peaks["bfloat16"]]
    threads = {f["threads"] for f in every}
    return {
        "machine": machine_info("torch", "transformers", "peft", torch_threads=sorted(threads)),
        "shape": shape,
        "repeats": repeats,
        "workload": {k: v for k, v in sizes.items() if not k.startswith("matmul")},
        "matmul_peak": matmul_peak,
        "decode": decode,
        "linear_floor": floors,
        "train": train,
        "profiles": profiles,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs a figure")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads for every figure (default: torch's). On a busy machine 1: two "
        "OpenMP threads beside a foreign busy process collapse (docs/performance.md)",
    )
    parser.add_argument("--out", type=Path, help="write the JSON here (BENCHMARKS.md untouched)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--publish", type=Path, help="publish a result JSON, measuring nothing")
    args = parser.parse_args(argv)
    if args.child:
        from _limit_figures import run_figure

        print(json.dumps(run_figure(json.loads(args.child))))
        return
    from _limit_report import section

    if args.publish is not None:
        result = json.loads(args.publish.read_text())
    else:
        result = measure_all(args.shape, args.repeats, args.threads)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(section(result, START, END))
        return
    from _markdown import publish

    publish(result, RESULTS, START, END, section(result, START, END))


def measure_all(shape: str, repeats: int, threads: int | None) -> dict[str, Any]:
    """Every figure on `shape`'s model: SmolLM2 in child processes, the tiny model in this one."""
    with tempfile.TemporaryDirectory() as scratch:
        if shape == "tiny":
            from tests.support.tiny_model import build_tiny_model

            model_dir = str(build_tiny_model(Path(scratch) / "tiny"))
            return run("tiny", model_dir, 1, in_process=True, threads=threads)
        from art_backend.engines._loading import ensure_default_model

        return run("smollm2", str(ensure_default_model()), repeats, False, threads)


if __name__ == "__main__":
    main()
