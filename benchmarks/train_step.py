"""One GRPO step, ours against TRL's GRPOTrainer, side by side in one run.

SmolLM2-135M-Instruct, 4 prompts x 4 completions x up to 32 new tokens, LoRA r16/alpha 32 on
q,k,v,o, matched loss (TRL `loss_type="dapo"` = our `grpo` preset: token mean over the step,
eps 0.2/0.28, `scale_rewards="group"`, beta 0), lr 1e-5, the same reward (a digit in the answer).
A step is generation + training (+ for us, the checkpoint write and serving the new step).
Medians over `--steps` steps after `--warmup`. Each contender runs alone, in its own processes.

    .venv/bin/python benchmarks/train_step.py [--steps 4] [--warmup 1] [--trl-dtype float32]
        [--baseline CHECKOUT] [--not-invariant]

`--baseline CHECKOUT` adds our step from another checkout (its art_core and art_backend first on
the path of a process of its own, this checkout's benchmark), in the same run, before TRL.
`--not-invariant` adds our step with `ART_BATCH_INVARIANT=0` (a process of its own): what the
sampler's and the trainer's bit-equal logprobs cost a bf16 step (a float32 one has no such
forwards, so the two match there).
`--context-tokens N` puts a document of about N tokens before each of the 4 questions (a
different one each: an agent's long context, a tool's output or a file), the same prompts for
both contenders; it writes benchmarks/results/train_step_context.json and its own section.

Writes benchmarks/results/train_step.json and the train_step section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import OtherLoad, checkout_commit
from _markdown import publish
from _ours import engine_args, qkvo_model
from _trl_peer import DEFAULT_PROMPTS, run_trl_in_subprocess

import art_core as art

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "train_step.json"
START, END = "<!-- train_step:start -->", "<!-- train_step:end -->"
CONTEXT_RESULTS = ROOT / "benchmarks" / "results" / "train_step_context.json"
CONTEXT_START, CONTEXT_END = "<!-- train_step_context:start -->", "<!-- train_step_context:end -->"
# TRL's forwards on long prompts, by 4 completions (gradients accumulated over the step's 16):
# 16 rows of ~1,060 tokens in one forward took the 24 GB machine's memory and were killed.
TRL_CONTEXT_MICRO_BATCH = 4
LINE_TOKENS = 18  # SmolLM2's tokens in one line of `step_prompts`' documents
# Issue 53's target for one GRPO step against TRL's (0.5 when this benchmark was written).
STEP_RATIO_TARGET = 0.25
INVARIANCE_VARIABLE = "ART_BATCH_INVARIANT"
INVARIANCE_OFF = f"{INVARIANCE_VARIABLE}=0"  # `--not-invariant`'s contender


class TreeRss:
    """Peak resident memory of a process and its children, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                total = self.process.memory_info().rss
                total += sum(c.memory_info().rss for c in self.process.children(recursive=True))
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def digit_reward(text: str) -> float:
    return 1.0 if any(ch.isdigit() for ch in text) else 0.0


def step_prompts(context_tokens: int) -> list[str]:
    """The step's 4 questions, each after a document of about `context_tokens` tokens of its
    own where asked (lines of records, `LINE_TOKENS` each)."""
    if context_tokens <= 0:
        return list(DEFAULT_PROMPTS)
    lines = max(1, context_tokens // LINE_TOKENS)
    return [
        "\n".join(
            f"Record {number}-{line}: item {(line * 7 + number) % 101} weighs "
            f"{(line * 13 + number) % 97} grams."
            for line in range(lines)
        )
        + "\n\n"
        + question
        for number, question in enumerate(DEFAULT_PROMPTS)
    ]


async def our_steps(args: argparse.Namespace, engine: str = "torch") -> dict[str, Any]:
    """Our full step: 4 requests with n=4 -> 16 trajectories -> model.train -> step N+1 served."""
    sampler = TreeRss(psutil.Process().pid)
    with tempfile.TemporaryDirectory(prefix="art-bench-") as path:
        backend = art.LocalBackend(path=path, dtype=args.dtype, extra_args=engine_args(engine))
        model = qkvo_model("bench")
        await model.register(backend)
        client = model.openai_client()
        config = art.TrainConfig(learning_rate=1e-5, loss="grpo", scale_rewards="group", beta=0.0)
        prompts = step_prompts(args.context_tokens)
        prompt_tokens: list[int] = []  # this step's, one a request
        steps = []
        for step in range(args.warmup + args.steps):
            started = time.perf_counter()
            prompt_tokens.clear()

            async def prompt_group(prompt: str, seed: int) -> art.TrajectoryGroup:
                messages = [{"role": "user", "content": prompt}]
                response = await client.chat.completions.create(
                    model=model.get_inference_name(),
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=32,
                    temperature=1.0,
                    n=4,
                    # Seeded: the baseline checkout samples the same tokens (its sampler and
                    # trainer are deterministic), so the two steps train the same rows.
                    seed=seed,
                )
                prompt_tokens.append(response.usage.prompt_tokens if response.usage else 0)
                return art.TrajectoryGroup(
                    art.Trajectory(
                        messages_and_choices=[*messages, choice],
                        reward=digit_reward(choice.message.content or ""),
                    )
                    for choice in response.choices
                )

            groups = await asyncio.gather(
                *(prompt_group(p, 100 * step + 4 * i) for i, p in enumerate(prompts))
            )
            generated = time.perf_counter()
            result = await model.train(list(groups), config=config)
            finished = time.perf_counter()
            steps.append(
                {
                    "step_s": finished - started,
                    "rollout_s": generated - started,
                    "train_s": finished - generated,
                    "trainer_s": result.metrics.get("trainer_seconds", 0.0),
                    "trained_tokens": result.metrics.get("trained_tokens", 0.0),
                    "trained": result.metrics.get("trained", 0.0),
                    "logprob_abs_diff": result.metrics.get("logprob_abs_diff", float("nan")),
                    "ratio_mean": result.metrics.get("ratio_mean", float("nan")),
                    "prompt_tokens": statistics.mean(prompt_tokens),
                    "completion_tokens": sum(
                        len(getattr(t.messages_and_choices[-1], "token_ids", []) or [])
                        for g in groups
                        for t in g.trajectories
                    ),
                }
            )
        await backend.close()
    peak = sampler.stop()
    measured = steps[args.warmup :]
    return {
        "contender": f"ours (art_core.LocalBackend + art_backend, --engine {engine})",
        "engine": engine,
        "dtype": args.dtype,
        "median_step_s": statistics.median(s["step_s"] for s in measured),
        "median_rollout_s": statistics.median(s["rollout_s"] for s in measured),
        "median_train_s": statistics.median(s["train_s"] for s in measured),
        "median_trained_tokens": statistics.median(s["trained_tokens"] for s in measured),
        "median_logprob_abs_diff": statistics.median(s["logprob_abs_diff"] for s in measured),
        "median_ratio_mean": statistics.median(s["ratio_mean"] for s in measured),
        "median_prompt_tokens": statistics.median(s["prompt_tokens"] for s in measured),
        "median_train_s_per_trained_token": statistics.median(
            s["train_s"] / s["trained_tokens"] for s in measured if s["trained_tokens"]
        ),
        "peak_rss_mb": peak / 2**20,
        "steps": steps,
    }


def markdown(result: dict[str, Any]) -> str:
    ours, trl = result["ours"], result["trl"]
    ratio = result["ratios"]
    vllm = result.get("ours_vllm")
    baseline = result.get("baseline")
    variant = result.get("ours_not_invariant")
    extra = [side for side in (baseline, variant, vllm) if side]
    sides = [ours, *extra, trl]

    def row(name: str, value) -> str:
        return f"| {name} | " + " | ".join(f"{value(side):.2f}" for side in sides) + " |"

    rows = [
        row("full step (s, median)", lambda c: c["median_step_s"]),
        row("  generation (s)", lambda c: c["median_rollout_s"]),
        row("  training (s)", lambda c: c["median_train_s"]),
        row("trained tokens per step", lambda c: c["median_trained_tokens"]),
        row("training s per 1k trained tokens",
            lambda c: 1000 * c["median_train_s"] / max(c["median_trained_tokens"], 1)),
        row("peak RSS (MB, all processes)", lambda c: c["peak_rss_mb"]),
    ]  # fmt: skip
    table = "\n".join(rows)
    header = "| | ours (torch engine) | "
    header += f"ours at `{baseline['commit']}` | " if baseline else ""
    header += f"ours, `{INVARIANCE_OFF}` | " if variant else ""
    header += ("ours (vLLM engine) | " if vllm else "") + "TRL |"
    header += "\n|---|---|" + "---|" * len(extra) + "---|"
    contender_lines = (
        f"\nAgainst our step at `{baseline['commit']}` (same run, a process of its own): "
        f"**{ratio['step_over_baseline']:.2f}x** its time; that step was "
        f"{ratio['baseline_step']:.2f}x TRL's."
        if baseline
        else ""
    )
    if variant:
        contender_lines += (
            f"\nWithout the bit equality (`{INVARIANCE_OFF}`, a process of its own: SDPA "
            "attention and whole linear calls; sampler/trainer logprob mean |diff| "
            f"{variant.get('median_logprob_abs_diff', float('nan')):.2e}, ratio_mean "
            f"{variant.get('median_ratio_mean', float('nan')):.4f}): our generation is "
            f"**{ratio['generation_over_not_invariant']:.2f}x** that step's, our training per "
            f"trained token {ratio['training_per_token_over_not_invariant']:.2f}x, the full "
            f"step {ratio['step_over_not_invariant']:.2f}x (the two sample differently, so "
            "they train different numbers of tokens); that step was "
            f"{ratio['not_invariant_step']:.2f}x TRL's."
        )
    verdict_step = "met" if ratio["step"] <= STEP_RATIO_TARGET else "missed"
    verdict_rss = "met" if ratio["peak_rss"] <= 1.0 else "missed"
    vllm_line = ""
    if vllm:
        vllm_ratio = ratio["step_vllm"]
        vllm_verdict = "met" if vllm_ratio <= STEP_RATIO_TARGET else "missed"
        vllm_line = (
            f"\nOn the vLLM engine (`--engine vllm`, vLLM's CPU build serving, our trainer "
            f"training): full step **{vllm_ratio:.2f}x** TRL's (target <= {STEP_RATIO_TARGET}: "
            f"{vllm_verdict}); sampler/trainer logprob mean |diff| "
            f"{vllm.get('median_logprob_abs_diff', float('nan')):.2e}, ratio_mean "
            f"{vllm.get('median_ratio_mean', float('nan')):.4f} (torch engine: "
            f"{ours.get('median_logprob_abs_diff', float('nan')):.2e}, "
            f"{ours.get('median_ratio_mean', float('nan')):.4f})."
        )
    start, end, title, prompts = START, END, "", "4 prompts"
    if result.get("context_tokens"):
        start, end = CONTEXT_START, CONTEXT_END
        title = f" on long prompts (`--context-tokens {result['context_tokens']}`)"
        prompts = (
            f"4 prompts of {ours['median_prompt_tokens']:.0f} tokens (ours) / "
            f"{trl['median_prompt_tokens'] / 16:.0f} (TRL), a document of records before each "
            "question,"
        )
    return f"""{start}
## One GRPO step{title}: ours vs TRL GRPOTrainer (`benchmarks/train_step.py`)

{result["when"]}, {result["machine"]}. SmolLM2-135M-Instruct, {prompts} x 4 completions x up to
32 new tokens, LoRA r16/alpha 32 on q,k,v,o, DAPO-style token-mean loss (eps 0.2/0.28),
`scale_rewards="group"`, beta 0, lr 1e-5; ours in {ours["dtype"]}, TRL with
bf16 autocast = {trl["bf16_autocast"]} (use_vllm=False, use_cpu=True, trl {trl["trl_version"]}).
Medians of {result["steps"]} steps after {result["warmup"]} warm-up step(s); each contender alone.

{header}
{table}

Ratios (ours / TRL): full step **{ratio["step"]:.2f}x** (target <= {STEP_RATIO_TARGET}: {verdict_step}),
peak RSS **{ratio["peak_rss"]:.2f}x** (target <= 1: {verdict_rss}).{contender_lines}{vllm_line}
Our step includes writing the checkpoint and loading the new step into the server. Other load
(cores used outside the benchmark, mean over each contender's run): {_loads(result)}.
{end}"""


def _loads(result: dict[str, Any]) -> str:
    names = {
        "ours": "ours/torch",
        "baseline": "baseline",
        "ours_not_invariant": INVARIANCE_OFF,
        "ours_vllm": "ours/vLLM",
        "trl": "TRL",
    }
    return ", ".join(
        f"{label} {result[key]['other_load_cores']:.2f}"
        for key, label in names.items()
        if key in result and "other_load_cores" in result[key]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtype", default="float32", help="our engine and trainer dtype")
    parser.add_argument("--trl-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--engines", default="torch", help="comma list of our engines to run: torch,vllm"
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--baseline", type=Path, help="another checkout's step, same run")
    parser.add_argument(
        "--not-invariant",
        action="store_true",
        help=f"also our step with {INVARIANCE_OFF} (what the bit equality costs), same run",
    )
    parser.add_argument(
        "--context-tokens", type=int, default=0, help="a document of ~N tokens before each prompt"
    )
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)  # a baseline's answer
    parser.add_argument(
        "--no-peer",
        action="store_true",
        help="ours only, nothing written (e.g. logprob_abs_diff per dtype: --dtype bfloat16)",
    )
    args = parser.parse_args()

    from art_backend.testing import ensure_default_model

    model_dir = str(ensure_default_model())
    engines = args.engines.split(",")
    runs: dict[str, dict[str, Any]] = {}
    for engine in engines:
        print(f"ours, {engine} engine ...", flush=True)
        with OtherLoad() as load:
            runs[engine] = asyncio.run(our_steps(args, engine))
        runs[engine]["other_load_cores"] = load.cores
        shown = {k: v for k, v in runs[engine].items() if k != "steps"}
        print(json.dumps(shown, indent=2), flush=True)
    ours = runs[engines[0]]
    if args.json_out:
        args.json_out.write_text(json.dumps(ours))
        return
    if args.no_peer:
        return
    baseline = _baseline_steps(args) if args.baseline else None
    variant = _not_invariant_steps(args) if args.not_invariant else None
    print("TRL GRPOTrainer ...", flush=True)
    with OtherLoad() as load:
        trl = run_trl_in_subprocess(
            model_dir,
            prompts=step_prompts(args.context_tokens),
            micro_batch=TRL_CONTEXT_MICRO_BATCH if args.context_tokens else None,
            steps=args.steps,
            warmup=args.warmup,
            bf16_autocast=args.trl_dtype == "bfloat16",
        )
    trl["other_load_cores"] = load.cores
    print(json.dumps({k: v for k, v in trl.items() if k != "steps"}, indent=2), flush=True)
    result = {
        "when": time.strftime("%Y-%m-%d"),
        "machine": f"{psutil.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "steps": args.steps,
        "warmup": args.warmup,
        "context_tokens": args.context_tokens,
        "ours": ours,
        "trl": trl,
        "ratios": {
            "step": ours["median_step_s"] / trl["median_step_s"],
            "peak_rss": ours["peak_rss_mb"] / trl["peak_rss_mb"],
        },
    }
    if baseline is not None:
        result["baseline"] = baseline
        result["ratios"]["step_over_baseline"] = ours["median_step_s"] / baseline["median_step_s"]
        result["ratios"]["baseline_step"] = baseline["median_step_s"] / trl["median_step_s"]
    if variant is not None:
        result["ours_not_invariant"] = variant
        result["ratios"]["step_over_not_invariant"] = (
            ours["median_step_s"] / variant["median_step_s"]
        )
        result["ratios"]["generation_over_not_invariant"] = (
            ours["median_rollout_s"] / variant["median_rollout_s"]
        )
        result["ratios"]["training_per_token_over_not_invariant"] = (
            ours["median_train_s_per_trained_token"] / variant["median_train_s_per_trained_token"]
        )
        result["ratios"]["not_invariant_step"] = variant["median_step_s"] / trl["median_step_s"]
    if "vllm" in runs and engines[0] != "vllm":
        result["ours_vllm"] = runs["vllm"]
        result["ratios"]["step_vllm"] = runs["vllm"]["median_step_s"] / trl["median_step_s"]
    if args.no_write:
        print(markdown(result))
    elif args.context_tokens:
        publish(result, CONTEXT_RESULTS, CONTEXT_START, CONTEXT_END, markdown(result))
    else:
        publish(result, RESULTS, START, END, markdown(result))


def _not_invariant_steps(args: argparse.Namespace) -> dict[str, Any]:
    """Our step with the batch-invariant forwards off, in a process of its own."""
    print(f"ours with {INVARIANCE_OFF} ...", flush=True)
    return _steps_in_child(args, {INVARIANCE_VARIABLE: "0"})


def _baseline_steps(args: argparse.Namespace) -> dict[str, Any]:
    """Our step from the checkout `args.baseline`, in a process of its own (see the doc)."""
    checkout = args.baseline.resolve()
    if not (checkout / "backend" / "art_backend").is_dir():
        raise SystemExit(f"--baseline {checkout} is not a checkout of this repository")
    commit = checkout_commit(checkout)
    print(f"ours at {commit} (baseline) ...", flush=True)
    paths = [str(checkout), str(checkout / "backend"), os.environ.get("PYTHONPATH", "")]
    result = _steps_in_child(args, {"PYTHONPATH": os.pathsep.join(filter(None, paths))})
    result["commit"] = commit
    return result


def _steps_in_child(args: argparse.Namespace, environment: dict[str, str]) -> dict[str, Any]:
    """`our_steps` in a child process with `environment` added to ours."""
    import subprocess

    environment = {**os.environ, **environment}
    with tempfile.TemporaryDirectory(prefix="art-bench-") as folder:
        answer = Path(folder) / "steps.json"
        command = [sys.executable, __file__, "--steps", str(args.steps), "--warmup",
                   str(args.warmup), "--dtype", args.dtype, "--json-out", str(answer),
                   "--context-tokens", str(args.context_tokens)]  # fmt: skip
        with OtherLoad() as load:
            subprocess.run(command, env=environment, check=True)
        result = json.loads(answer.read_text())
    result["other_load_cores"] = load.cores
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=2), flush=True)
    return result


if __name__ == "__main__":
    main()
