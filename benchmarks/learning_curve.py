"""Held-out reward against training wall-clock on the demo task: ours vs TRL GRPOTrainer.

Same task, questions in the same order, same settings (groups x rollouts per step, temperature
1.0, 16 new tokens, LoRA r16/alpha 32 on q,k,v,o, the same lr, DAPO-style token-mean loss,
beta 0). The held-out set is answered greedily at step 0, every `--eval-every` steps and at the
end; evaluation time is excluded from both clocks. The target: ours reaches TRL's final held-out
reward in at most a quarter of TRL's training time. TRL runs first; ours then trains past `--steps`
(up to 3x) while its clock is under TRL's time and it has not reached TRL's final reward.

`--pipeline` adds a third contender, "ours_pipeline": the same task and settings trained with
`art.PipelineTrainer` (rollouts of the next groups overlap training; groups at most
`--max-steps-off-policy` steps old; zero-variance groups dropped client-side, so each step trains
`--groups-per-step` informative groups). Its rollouts pause during evaluations, which are
excluded from its clock as from the others'.

`--seeds N` repeats TRL and ours on N splits of the questions (seeds `--seed`..) and judges the
target by the median ratio; other engines and `--pipeline` run on the first seed only.
`--contenders ours,ours_auto,ours_signal` runs more of ours each seed (see `_curve_seeds.py`: the
dtype by measurement, and `art.GroupSignal`), summarised over seeds per evaluation step.

    .venv/bin/python benchmarks/learning_curve.py [--steps 12] [--eval-every 4] [--seeds 3]

Writes benchmarks/results/learning_curve.json and the learning_curve section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

from _curve_seeds import CONTENDERS, contender_settings, median_ratio, over_seeds  # noqa: E402
from _curve_seeds import markdown as contenders_markdown  # noqa: E402
from _machine import OtherLoad  # noqa: E402
from _markdown import publish  # noqa: E402
from _ours import engine_args, qkvo_model  # noqa: E402
from demo import evaluate, rollout  # noqa: E402
from demo_task import add_task_arguments, split  # noqa: E402

import art_core as art  # noqa: E402

RESULTS = HERE / "results" / "learning_curve.json"
START, END = "<!-- learning_curve:start -->", "<!-- learning_curve:end -->"
TIME_RATIO_TARGET = 0.25  # issue 31: a quarter of TRL's time to its final held-out reward


async def our_curve(
    args: argparse.Namespace,
    engine: str = "torch",
    *,
    target: float | None = None,
    time_limit: float | None = None,
    dtype: str | None = None,
    signal: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The demo's loop, with the training clock stopped during held-out evaluations.

    With a `target` (TRL's final held-out reward) and a `time_limit` (TRL's training time), it
    goes on past `--steps` while its clock is under the limit and the target is not reached, so
    the crossing is measured instead of read as "not reached" (at most 3x `--steps`).
    """
    train_questions, held_out = split(args.train_questions, args.eval_size, seed=args.seed)
    group_signal = None if signal is None else art.GroupSignal(**signal)
    metrics: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="art-curve-") as path:
        backend = art.LocalBackend(
            path=path, dtype=dtype or args.dtype, extra_args=engine_args(engine)
        )
        model = qkvo_model("curve")
        await model.register(backend)
        config = art.TrainConfig(learning_rate=args.learning_rate, **(train or {}))
        points = [
            {
                "step": 0,
                "train_seconds": 0.0,
                "heldout_reward": (await evaluate(model, held_out)).metrics["reward"],
            }
        ]
        clock = 0.0
        for batch in art.iterate_dataset(
            train_questions,
            args.groups_per_step,
            num_epochs=100,
            use_tqdm=False,
            signal=group_signal,
        ):
            if batch.step >= args.steps and not _goes_on(points, clock, target, time_limit):
                break
            if batch.step >= 3 * args.steps:
                break
            started = time.perf_counter()
            groups = await art.gather_trajectory_groups(
                batch.groups(
                    lambda q: art.TrajectoryGroup(
                        rollout(model, q) for _ in range(args.rollouts_per_group)
                    )
                ),
                pbar_desc=None,
            )
            result = await model.train(groups, config=config)
            clock += time.perf_counter() - started
            metrics.append(
                {k: v for k, v in result.metrics.items() if k.startswith(("signal/", "groups/"))}
            )
            if result.step % args.eval_every == 0 or result.step == args.steps:
                reward = (await evaluate(model, held_out)).metrics["reward"]
                points.append(
                    {"step": result.step, "train_seconds": clock, "heldout_reward": reward}
                )
                print(
                    f"  ours ({engine}) step {result.step}: {clock:.0f}s, held-out {reward:.3f}",
                    flush=True,
                )
        await backend.close()
    return {
        "contender": "ours",
        "engine": engine,
        "dtype": dtype or args.dtype,
        "signal": signal,
        "train": train,
        "points": points,
        "groups": _group_totals(metrics),
    }


def _group_totals(metrics: list[dict[str, float]]) -> dict[str, float]:
    """Groups sampled, trained and skipped over the run (the server's and the signal's counts)."""
    total = lambda key: float(sum(m.get(key, 0.0) for m in metrics))  # noqa: E731
    return {
        "trainable": total("groups/trainable"),
        "zero_variance": total("groups/zero_variance"),
        "extra_sampled": total("signal/extra_groups"),
        "skipped_scenarios": total("signal/skipped_scenarios"),
    }


def _goes_on(
    points: list[dict[str, Any]], clock: float, target: float | None, limit: float | None
) -> bool:
    """Past `--steps`: train on while under TRL's time and short of TRL's final reward."""
    if target is None or limit is None or clock >= limit:
        return False
    return points[-1]["heldout_reward"] < target


async def pipeline_curve(args: argparse.Namespace, engine: str = "torch") -> dict[str, Any]:
    """The demo task trained by PipelineTrainer; held-out reward against training wall-clock."""
    train_questions, held_out = split(args.train_questions, args.eval_size, seed=args.seed)
    # The questions in the order the synchronous loop takes them, one group each.
    scenarios = (
        question
        for batch in art.iterate_dataset(
            train_questions, args.groups_per_step, num_epochs=100, use_tqdm=False
        )
        for question in batch.items
    )
    sampling = asyncio.Event()  # cleared while the held-out set is evaluated
    sampling.set()
    in_flight = 0
    points: list[dict[str, Any]] = []
    excluded = 0.0  # seconds spent evaluating, off the clock
    started = 0.0

    async def group_rollout(model: art.TrainableModel, question: Any, config: None):
        nonlocal in_flight
        await sampling.wait()
        in_flight += 1
        try:
            group = art.TrajectoryGroup(
                rollout(model, question) for _ in range(args.rollouts_per_group)
            )
            # Failed rollouts stay on the group (counted by the server), as in the other loop.
            [group] = await art.gather_trajectory_groups(
                [group], pbar_desc=None, max_exceptions=args.rollouts_per_group
            )
            return group
        finally:
            in_flight -= 1

    async def evaluate_step(model: art.TrainableModel, step: int, config: None) -> None:
        nonlocal excluded
        sampling.clear()
        while in_flight:  # rollouts already running finish on the clock
            await asyncio.sleep(0.05)
        paused = time.perf_counter()
        clock = paused - started - excluded
        reward = (await evaluate(model, held_out)).metrics["reward"]  # logs itself as "val"
        excluded += time.perf_counter() - paused
        points.append({"step": step, "train_seconds": clock, "heldout_reward": reward})
        print(
            f"  ours_pipeline ({engine}) step {step}: {clock:.0f}s, held-out {reward:.3f}",
            flush=True,
        )
        sampling.set()

    with tempfile.TemporaryDirectory(prefix="art-curve-") as path:
        backend = art.LocalBackend(path=path, dtype=args.dtype, extra_args=engine_args(engine))
        model = qkvo_model("curve-pipeline")
        await model.register(backend)
        trainer = art.PipelineTrainer(
            model,
            backend,
            group_rollout,
            scenarios,
            None,
            evaluate_step,
            num_rollout_workers=args.groups_per_step,
            min_batch_size=args.groups_per_step,
            max_batch_size=args.groups_per_step,
            max_steps_off_policy=args.max_steps_off_policy,
            max_steps=args.steps,
            eval_every_n_steps=args.eval_every,
            # The other contenders' step: our "grpo" preset (DAPO-style token-mean loss).
            train_config=art.TrainConfig(learning_rate=args.learning_rate, loss="grpo"),
        )
        started = time.perf_counter()
        await trainer.train()
        if points[-1]["step"] != model.step:
            await evaluate_step(model, model.step, None)
        await backend.close()
    state = trainer.state
    return {
        "contender": "ours_pipeline",
        "engine": engine,
        "points": points,
        "max_steps_off_policy": args.max_steps_off_policy,
        "discarded": {
            "stale_groups": state.discarded_stale_groups,
            "zero_variance_groups": state.discarded_zero_variance_groups,
            "failed_rollouts": state.failed_rollouts,
        },
    }


def time_to_reach(points: list[dict[str, Any]], target: float) -> float | None:
    """Training seconds at the first evaluation whose held-out reward is >= target."""
    for point in points:
        if point["heldout_reward"] >= target:
            return point["train_seconds"]
    return None


def markdown(result: dict[str, Any]) -> str:
    ours, trl = result["ours"]["points"], result["trl"]["points"]
    vllm = result.get("ours_vllm", {}).get("points")
    pipeline = result.get("ours_pipeline", {}).get("points")
    steps = sorted({p["step"] for p in [*ours, *trl, *(vllm or []), *(pipeline or [])]})

    def cell(points: list[dict[str, Any]], step: int) -> str:
        match = [p for p in points if p["step"] == step]
        return (
            f"{match[0]['heldout_reward']:.3f} @ {match[0]['train_seconds']:.0f}s" if match else ""
        )

    table = "\n".join(
        f"| {s} | {cell(ours, s)} | "
        + (f"{cell(vllm, s)} | " if vllm else "")
        + (f"{cell(pipeline, s)} | " if pipeline else "")
        + f"{cell(trl, s)} |"
        for s in steps
    )
    header = (
        "| step | ours (torch engine): held-out reward @ training time | "
        + ("ours (vLLM engine) | " if vllm else "")
        + ("ours, PipelineTrainer | " if pipeline else "")
        + "TRL: held-out reward @ training time |\n|---|---|"
        + ("---|" if vllm else "")
        + ("---|" if pipeline else "")
        + "---|"
    )
    vllm_line = ""
    if vllm:
        reached = summary_vllm = result["summary"].get("ours_vllm_seconds_to_trl_final")
        ratio_vllm = result["summary"].get("time_ratio_vllm")
        vllm_line = (
            "\nOn the vLLM engine: TRL's final reward "
            + (
                f"reached after {reached:.0f}s, **{ratio_vllm:.2f}x** TRL's time"
                if summary_vllm is not None and ratio_vllm is not None
                else "not reached"
            )
            + "."
        )
    pipeline_line = ""
    if pipeline:
        reached = result["summary"].get("ours_pipeline_seconds_to_trl_final")
        ratio_pipeline = result["summary"].get("time_ratio_pipeline")
        dropped = result["ours_pipeline"]["discarded"]
        pipeline_line = (
            "\nWith PipelineTrainer (max_steps_off_policy "
            f"{result['ours_pipeline']['max_steps_off_policy']}): TRL's final reward "
            + (
                f"reached after {reached:.0f}s, **{ratio_pipeline:.2f}x** TRL's time"
                if reached is not None and ratio_pipeline is not None
                else "not reached"
            )
            + f"; dropped {dropped['stale_groups']} stale and "
            f"{dropped['zero_variance_groups']} zero-variance groups, "
            f"{dropped['failed_rollouts']} failed rollouts."
        )
    loads = ", ".join(
        f"{key} {result[key]['other_load_cores']:.2f}"
        for key in ("ours", "ours_vllm", "ours_pipeline", "trl")
        if key in result and "other_load_cores" in result[key]
    )
    summary = result["summary"]
    ratio = summary["time_ratio"]
    verdict = (
        "not reached by ours" if ratio is None
        else f"**{ratio:.2f}x** (target <= {TIME_RATIO_TARGET}: {'met' if ratio <= TIME_RATIO_TARGET else 'missed'})"
    )  # fmt: skip
    s = result["settings"]
    seeds_block = _seeds_markdown(result)
    return f"""{START}
## Learning curve on the demo task: ours vs TRL GRPOTrainer (`benchmarks/learning_curve.py`)

{result["when"]}, {result["machine"]}. SmolLM2-135M-Instruct, ours {s.get("dtype", "float32")}, TRL float32, the `make demo` task
(`examples/demo_task.py`), {s["steps"]} steps of {s["groups_per_step"]} questions x
{s["rollouts_per_group"]} rollouts (temperature 1.0, 16 new tokens), LoRA r16/alpha 32 on
q,k,v,o, lr {s["learning_rate"]}, DAPO-style token-mean loss, beta 0; same questions in the same
order. Held-out: {s["eval_size"]} questions, greedy; evaluation time excluded from the clocks.

{header}
{table}

TRL's final held-out reward {summary["trl_final"]:.3f} after {summary["trl_seconds"]:.0f}s; ours
first reaches it after {_seconds(summary["ours_seconds_to_trl_final"])}: time ratio {verdict}
(times to reach are read at the evaluation points only, every {s["eval_every"]} steps; TRL runs
first, and ours trains on past step {s["steps"]} while its clock is under TRL's time and it is
short of TRL's final reward, so a crossing is measured, not guessed).{vllm_line}{pipeline_line}
{seeds_block}Other load (cores used outside the benchmark, mean over each run): {loads or "-"}.
{contenders_markdown(result, TIME_RATIO_TARGET)}{END}"""


def _seeds_markdown(result: dict[str, Any]) -> str:
    """The per-seed table and the median ratio, when the run had more than one seed."""
    seeds = result.get("seeds", [])
    if len(seeds) < 2:
        return ""
    steps = result["settings"]["steps"]
    rows = "\n".join(
        f"| {run['seed']} | {run['trl_final']:.3f} @ {run['trl_seconds']:.0f}s | "
        f"{_seconds(run['ours_seconds_10_steps'])} | "
        f"{_seconds(run['ours_seconds_to_trl_final'])} | "
        + ("not reached" if run["time_ratio"] is None else f"{run['time_ratio']:.2f}x")
        + f" | {run['other_load_cores']['ours']:.2f} / {run['other_load_cores']['trl']:.2f} |"
        for run in seeds
    )
    ratio = result["summary"]["median_time_ratio"]
    verdict = (
        "not reached"
        if ratio is None
        else f"**{ratio:.2f}x** (target <= {TIME_RATIO_TARGET}: "
        f"{'met' if ratio <= TIME_RATIO_TARGET else 'missed'})"
    )
    return f"""
Every seed (a different split of the questions into training and held-out sets; TRL, then ours,
each seed; the table above is seed {seeds[0]["seed"]}):

| seed | TRL: final held-out reward @ time | ours: {steps} steps in | ours: TRL's final reached at | time ratio | other load (ours / TRL) |
|---|---|---|---|---|---|
{rows}

Median time ratio over {len(seeds)} seeds: {verdict}.
"""


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


def run_seed(args: argparse.Namespace, engines: list[str]) -> dict[str, Any]:
    """TRL, then ours on each engine, on `args.seed`'s split of the questions."""
    from _trl_learning_curve import run_trl_curve_in_subprocess

    from art_backend.testing import ensure_default_model

    print(f"seed {args.seed}: TRL GRPOTrainer ...", flush=True)
    with OtherLoad() as load:
        trl = run_trl_curve_in_subprocess(
            str(ensure_default_model()),
            steps=args.steps,
            groups_per_step=args.groups_per_step,
            rollouts_per_group=args.rollouts_per_group,
            learning_rate=args.learning_rate,
            eval_every=args.eval_every,
            train_questions=args.train_questions,
            eval_size=args.eval_size,
            seed=args.seed,
        )
    trl["other_load_cores"] = load.cores
    # TRL first: its final reward and time tell ours how far to go to measure the crossing.
    trl_final = trl["points"][-1]["heldout_reward"]
    trl_seconds = trl["points"][-1]["train_seconds"]
    runs: dict[str, dict[str, Any]] = {}
    for engine in engines:
        print(f"seed {args.seed}: ours, {engine} engine ...", flush=True)
        with OtherLoad() as load:
            runs[engine] = asyncio.run(
                our_curve(args, engine, target=trl_final, time_limit=trl_seconds)
            )
        runs[engine]["other_load_cores"] = load.cores
    ours = runs[engines[0]]
    contenders: dict[str, dict[str, Any]] = {}
    for name in args.contenders:
        settings = contender_settings(name, args.dtype, signal_settings(args))
        if name == "ours" and settings["dtype"] == args.dtype:
            run = ours  # the run above
        else:
            print(f"seed {args.seed}: {name} ({settings}) ...", flush=True)
            with OtherLoad() as load:
                run = asyncio.run(
                    our_curve(
                        args, engines[0], target=trl_final, time_limit=trl_seconds, **settings
                    )
                )
            run["other_load_cores"] = load.cores
        reached = time_to_reach(run["points"], trl_final)
        run["seconds_to_trl_final"] = reached
        run["time_ratio"] = reached / trl_seconds if reached is not None and trl_seconds else None
        contenders[name] = run
    pipeline = None
    if args.pipeline:
        print(f"ours with PipelineTrainer, {engines[0]} engine ...", flush=True)
        with OtherLoad() as load:
            pipeline = asyncio.run(pipeline_curve(args, engines[0]))
        pipeline["other_load_cores"] = load.cores
    ours_seconds = time_to_reach(ours["points"], trl_final)
    result = {
        "when": time.strftime("%Y-%m-%d"),
        "machine": f"{psutil.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k not in ("no_write", "engines", "pipeline", "seeds", "contenders")
        },
        "ours": ours,
        "trl": trl,
        "contenders": contenders,
        "summary": {
            "trl_final": trl_final,
            "trl_seconds": trl_seconds,
            "ours_final": ours["points"][-1]["heldout_reward"],
            "ours_seconds": ours["points"][-1]["train_seconds"],
            "ours_seconds_to_trl_final": ours_seconds,
            "time_ratio": ours_seconds / trl_seconds
            if ours_seconds is not None and trl_seconds
            else None,
        },
    }
    if "vllm" in runs and ours is not runs["vllm"]:
        result["ours_vllm"] = runs["vllm"]
        reached = time_to_reach(runs["vllm"]["points"], trl_final)
        result["summary"]["ours_vllm_seconds_to_trl_final"] = reached
        result["summary"]["time_ratio_vllm"] = (
            reached / trl_seconds if reached is not None and trl_seconds else None
        )
    if pipeline is not None:
        result["ours_pipeline"] = pipeline
        reached = time_to_reach(pipeline["points"], trl_final)
        result["summary"]["ours_pipeline_seconds_to_trl_final"] = reached
        result["summary"]["time_ratio_pipeline"] = (
            reached / trl_seconds if reached is not None and trl_seconds else None
        )
    return result


def _seconds_at(points: list[dict[str, Any]], step: int) -> float | None:
    match = [p["train_seconds"] for p in points if p["step"] == step]
    return match[0] if match else None


def signal_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ours_signal contender's GroupSignal keywords."""
    return {
        "min_trainable_groups": args.signal_min_trainable,
        "max_groups_per_step": args.signal_max_groups,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_task_arguments(parser, eval_every=2)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="runs of TRL and ours, seeds --seed.. (other engines and --pipeline: first seed only)",
    )
    parser.add_argument(
        "--dtype", default="float32", help="ours (TRL runs float32): auto would be bf16 here"
    )
    parser.add_argument(
        "--engines", default="torch", help="comma list of our engines to run: torch,vllm"
    )
    parser.add_argument(
        "--pipeline",
        action="store_true",
        help="also train with art.PipelineTrainer (ours_pipeline)",
    )
    parser.add_argument(
        "--max-steps-off-policy", type=int, default=1, help="the ours_pipeline contender's bound"
    )
    parser.add_argument(
        "--contenders",
        default="ours",
        help=f"comma list of ours to run beside TRL, each seed: {', '.join(CONTENDERS)}",
    )
    parser.add_argument("--signal-min-trainable", type=int, default=6, help="ours_signal's N")
    parser.add_argument("--signal-max-groups", type=int, default=16, help="ours_signal's bound")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    args.contenders = args.contenders.split(",")
    for name in args.contenders:
        contender_settings(name, args.dtype, signal_settings(args))  # unknown names fail now

    seeds = list(range(args.seed, args.seed + args.seeds))
    engines = args.engines.split(",")
    per_seed = [
        run_seed(
            argparse.Namespace(**{**vars(args), "seed": seed, "pipeline": args.pipeline and not i}),
            engines if i == 0 else engines[:1],
        )
        for i, seed in enumerate(seeds)
    ]
    result = per_seed[0]
    result["settings"]["seeds"] = seeds
    result["seeds"] = [
        {
            "seed": seed,
            "trl_final": run["summary"]["trl_final"],
            "trl_seconds": run["summary"]["trl_seconds"],
            "ours_seconds_to_trl_final": run["summary"]["ours_seconds_to_trl_final"],
            "ours_seconds_10_steps": _seconds_at(run["ours"]["points"], args.steps),
            "time_ratio": run["summary"]["time_ratio"],
            "ours_points": run["ours"]["points"],
            "trl_points": run["trl"]["points"],
            "other_load_cores": {
                "ours": run["ours"]["other_load_cores"],
                "trl": run["trl"]["other_load_cores"],
            },
            "contenders": {
                name: {
                    key: curve.get(key)
                    for key in ("points", "time_ratio", "dtype", "signal", "train", "groups")
                }
                | {"other_load_cores": curve["other_load_cores"]}
                for name, curve in run["contenders"].items()
            },
        }
        for seed, run in zip(seeds, per_seed, strict=True)
    ]
    result["over_seeds"] = over_seeds(result["seeds"], args.contenders)
    result["summary"]["median_time_ratio"] = median_ratio(
        [run["summary"]["time_ratio"] for run in per_seed]
    )
    if args.no_write:
        print(markdown(result))
    else:
        publish(result, RESULTS, START, END, markdown(result))


if __name__ == "__main__":
    main()
