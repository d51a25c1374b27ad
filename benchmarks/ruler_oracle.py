"""How RULER learning degrades as the judge gets noisier: the demo task, an oracle judge, a table.

Each noise level trains a fresh SmolLM2-135M-Instruct LoRA for `--steps` steps with RULER rewards
only, from `examples/oracle_judge.py` (a real OpenAI-compatible server on 127.0.0.1 reading our
RULER prompt and scoring each run by the demo's hidden exact-sum check). `noise` is the
probability that a run's score is replaced by a random 0..100; `--tie-rate` the probability
that a whole group gets one score. The held-out set (64 questions, greedy) is scored by the code
check the judge hides. Each level runs in its own child process with a fresh backend, under
`--level-timeout` (a level that hangs is recorded as such; one did once, see BENCHMARKS.md).
Noise 1 is the control: the rewards carry no information.

    .venv/bin/python benchmarks/ruler_oracle.py [--steps 8] [--noise 0 0.25 0.5 1]

Writes benchmarks/results/ruler_oracle.json, the ruler_oracle section of BENCHMARKS.md and one
report per level (before/after table, curve, examples) under .art/ruler-oracle-bench/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

from _machine import OtherLoad, machine_info  # noqa: E402
from _markdown import publish  # noqa: E402
from demo_task import split  # noqa: E402
from oracle_judge import OracleJudge  # noqa: E402
from ruler_oracle_demo import sum_check, train_with_oracle  # noqa: E402
from smollm2 import smollm2_trainable  # noqa: E402

import art_core as art  # noqa: E402
from art_core.report import before_after_table, write_report  # noqa: E402

REPORTS = HERE.parent / ".art" / "ruler-oracle-bench"
START, END = "<!-- ruler_oracle:start -->", "<!-- ruler_oracle:end -->"


async def measure_level(args: argparse.Namespace, noise: float) -> dict[str, Any]:
    """Train one fresh model at one noise level, on its own backend; the row as JSON-ready data."""
    train_questions, held_out = split(args.train_questions, args.eval_size, seed=args.seed)
    with tempfile.TemporaryDirectory() as folder:
        backend = art.LocalBackend(path=folder)
        try:
            model = smollm2_trainable(f"oracle-noise-{noise:g}", "ruler-oracle-bench")
            await model.register(backend)
            print(f"noise {noise:g}: {args.steps} steps", flush=True)
            load_before = os.getloadavg()[0]
            with (
                OracleJudge(
                    sum_check, noise=noise, tie_rate=args.tie_rate, seed=args.seed
                ) as judge,
                OtherLoad() as load,
            ):
                run = await train_with_oracle(
                    model,
                    judge,
                    train_questions,
                    held_out,
                    steps=args.steps,
                    groups_per_step=args.groups_per_step,
                    rollouts_per_group=args.rollouts_per_group,
                    learning_rate=args.learning_rate,
                )
            # The demo's report for each level: before/after table, curve, examples.
            report = write_report(
                REPORTS / f"noise-{noise:g}",
                title=f"RULER from an oracle judge with noise {noise:g}: held-out code check",
                description=(
                    f"GRPO with RULER rewards only, {args.steps} steps; the judge agreed with "
                    f"the hidden check on {run.judge_agreement:.0%} of the pairs it tells apart "
                    f"and tied {run.tied_groups}/{run.judged_groups} groups."
                ),
                before=run.before,
                after=run.after,
                history=await backend.history(model),
                settings={**vars(args), "noise": noise},
            )
            print(before_after_table(run.before, run.after), f"\nReport: {report}", flush=True)
        finally:
            await backend.close()
    return {
        "noise": noise,
        "tie_rate": args.tie_rate,
        "held_out_before": run.before.metrics["reward"],
        "held_out_after": run.after.metrics["reward"],
        "held_out_gain": run.gain,
        "exact_after": run.after.metrics["exact"],
        "judge_pair_agreement": run.judge_agreement,
        "tied_groups": run.tied_groups,
        "judged_groups": run.judged_groups,
        "seconds": round(run.seconds, 1),
        "other_load_cores": round(load.cores, 2),
        "loadavg_1min_at_start": load_before,
        "loadavg_1min_at_end": os.getloadavg()[0],
        "steps": run.steps,
    }


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One child process per noise level (a fresh backend each), each under `--level-timeout`:
    a level that hangs or fails is recorded as such and the others still run."""
    runs: list[dict[str, Any]] = []
    for noise in args.noise:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [sys.executable, __file__, "--noise", str(noise), "--level-json", out.name]
            for name in ("steps", "groups_per_step", "rollouts_per_group", "learning_rate",
                         "tie_rate", "train_questions", "eval_size", "seed"):  # fmt: skip
                command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            try:
                subprocess.run(command, check=True, timeout=args.level_timeout)
                runs.append(json.loads(Path(out.name).read_text()))
            except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as error:
                print(f"noise {noise:g}: no result ({error})", flush=True)
                runs.append({"noise": noise, "tie_rate": args.tie_rate, "failed": str(error)})
    return runs


def section(result: dict[str, Any]) -> str:
    """The BENCHMARKS.md section for `result`."""
    settings, machine = result["settings"], result["machine"]
    rows = "\n".join(
        f"| {r['noise']:g} | no result: {r['failed']} |||||||"
        if "failed" in r
        else f"| {r['noise']:g} | {r['judge_pair_agreement']:.0%} | {r['tied_groups']}/"
        f"{r['judged_groups']} | {r['held_out_before']:.3f} | {r['held_out_after']:.3f} | "
        f"{r['held_out_gain']:+.3f} | {r['exact_after']:.3f} | {r['seconds']:.0f}s | "
        f"{r['loadavg_1min_at_start']:.2f} / {r['other_load_cores']:.2f} |"
        for r in result["runs"]
    )
    return f"""{START}
## RULER with an oracle judge: held-out gain as the judge's noise rises (`benchmarks/ruler_oracle.py`)

{machine["date"][:10]}, {machine["cpu_count"]} cores. SmolLM2-135M-Instruct, the `make demo` task,
{settings["steps"]} steps of {settings["groups_per_step"]} questions x {settings["rollouts_per_group"]}
rollouts, lr {settings["learning_rate"]}, rewards from RULER only (`ruler_score_group` as
`after_each`, our prompt and schema) against `examples/oracle_judge.py`: a local
OpenAI-compatible server that scores each run by the hidden exact-sum check. Noise = the
probability that a run's score is replaced by a random 0..100; tie rate {settings["tie_rate"]} =
the probability that a whole group gets one score. Held-out: {settings["eval_size"]} questions,
greedy, scored by the code check the judge hides. One child process (fresh backend) per level.

| noise | judge agrees with the check (pairs it tells apart) | tied groups | held-out before | held-out after | gain | exact after | time | load 1-min at start / other cores |
|---|---|---|---|---|---|---|---|---|
{rows}

One seed per level, {settings["eval_size"]} held-out questions: differences under ~0.1 are within
run-to-run spread.
{END}"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.25, 0.5, 1.0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--rollouts-per-group", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--tie-rate", type=float, default=0.1)
    parser.add_argument("--train-questions", type=int, default=200)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level-timeout", type=float, default=600.0, help="seconds per level")
    parser.add_argument("--level-json", default=None, help=argparse.SUPPRESS)  # a child's output
    return parser.parse_args(argv)


def main() -> None:
    """Measure, then write the JSON results and the BENCHMARKS.md section."""
    args = parse_args()
    if args.level_json:  # a child: one level, its row to the file
        row = asyncio.run(measure_level(args, args.noise[0]))
        Path(args.level_json).write_text(json.dumps(row))
        return
    started = time.monotonic()
    settings = {k: v for k, v in vars(args).items() if k not in {"noise", "level_json"}}
    result = {
        "machine": machine_info("torch", "transformers", "openai"),
        "settings": settings,
        "runs": measure(args),
        "total_seconds": round(time.monotonic() - started, 1),
    }
    publish(result, HERE / "results" / "ruler_oracle.json", START, END, section(result))


if __name__ == "__main__":
    main()
