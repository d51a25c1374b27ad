"""RULER that learns, proven offline: the demo task trained with RULER rewards from an oracle judge.

No competent judge fits on a laptop CPU, so the judge here is `oracle_judge.OracleJudge`: a real
OpenAI-compatible server on 127.0.0.1 that reads our own RULER prompt and answers our own schema,
but scores each run by a hidden code check (the demo's exact-sum check), with `--noise` (the
probability that a run's score is random) and `--tie-rate` (the probability that it gives a
whole group one score). The policy's reward is only what RULER returns
(`after_each=ruler_score_group`); the code check is kept aside as `independent_reward` and is
what the held-out evaluation measures. If RULER's scores reached the gradient the wrong way
round, the held-out code check would fall.

Why the demo task and not the planner graph (`langgraph_planner_ruler.py`): the planner's code
check is 0/8 before training and its runs rarely differ on it, so even a perfect judge has
nothing to rank; the demo task has runs that a check can tell apart within each group, so the
run measures the RULER path, not the task's difficulty.

Measured (2 cores, load 1-min 3.3 at start, SmolLM2-135M-Instruct, 8 steps of 8 questions x 8
rollouts, noise 0, tie rate 0.1, run as the first level of `benchmarks/ruler_oracle.py`):
held-out code check 0.055 -> 0.422 (+0.367; exact 0.016 -> 0.141, right sum in the reply 0.094
-> 0.703) in about 4 minutes; the judge's pairs agreed with the check except in tied groups.

    python examples/ruler_oracle_demo.py [--steps 8] [--noise 0.0] [--tie-rate 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo import evaluate, rollout
from demo_task import Question, score, split
from oracle_judge import OracleJudge, last_assistant_text
from smollm2 import smollm2_trainable

import art_core as art
from art_core.report import Evaluation, mean_metric, print_summary, write_report

_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def sum_check(context: str, run: str) -> float:
    """The hidden truth: the demo's code reward of the run's answer to the question in context."""
    found = _QUESTION.search(context) or _QUESTION.search(run)
    if found is None:
        return 0.0
    question = Question(int(found[1]), int(found[2]))
    return score(question, last_assistant_text(run))["reward"]


def pair_agreement(groups: list[art.TrajectoryGroup]) -> tuple[int, int]:
    """(pairs the judge ordered as the hidden check does, pairs the check tells apart)."""
    agree = total = 0
    for group in groups:
        runs = [(t.metrics["independent_reward"], t.metrics["ruler_score"]) for t in group]
        for i, (truth_a, judged_a) in enumerate(runs):
            for truth_b, judged_b in runs[i + 1 :]:
                if truth_a != truth_b:
                    total += 1
                    agree += (truth_a - truth_b) * (judged_a - judged_b) > 0
    return agree, total


@dataclass
class OracleRun:
    """One training run against the oracle judge and what it measured."""

    noise: float
    before: Evaluation
    after: Evaluation
    steps: list[dict[str, Any]]
    judge_agreement: float
    tied_groups: int
    judged_groups: int
    seconds: float

    @property
    def gain(self) -> float:
        """Held-out code-check gain."""
        return self.after.metrics["reward"] - self.before.metrics["reward"]


async def train_with_oracle(
    model: art.TrainableModel,
    judge: OracleJudge,
    train_questions: list[Question],
    held_out: list[Question],
    *,
    steps: int,
    groups_per_step: int = 8,
    rollouts_per_group: int = 8,
    learning_rate: float = 3e-4,
    before: Evaluation | None = None,
) -> OracleRun:
    """Train `model` (registered) for `steps` steps with RULER rewards from `judge`."""
    started = time.monotonic()
    if before is None:
        before = await evaluate(model, held_out)
    print(f"  held-out code check at step {model.step}: {before.metrics['reward']:.3f}")
    score_group = functools.partial(
        art.ruler_score_group, judge=judge.model(), cache=False, swallow_exceptions=True
    )
    config = art.TrainConfig(learning_rate=learning_rate)
    rows: list[dict[str, Any]] = []
    agree = total = 0
    for batch in art.iterate_dataset(
        train_questions, groups_per_step, num_epochs=100, initial_step=model.step, use_tqdm=False
    ):
        if batch.step >= steps:
            break
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, q) for _ in range(rollouts_per_group))
                for q in batch.items
            ),
            pbar_desc=None,
            max_exceptions=0.1,
            after_each=score_group,
        )
        step_agree, step_total = pair_agreement(groups)
        agree, total = agree + step_agree, total + step_total
        result = await model.train(groups, config=config)
        row = {
            "step": result.step,
            "ruler_reward": result.metrics["reward"],
            "hidden_check": mean_metric(groups, "independent_reward"),
            "trainable_groups": result.metrics.get("groups/trainable", 0.0),
            "judge_pair_agreement": step_agree / step_total if step_total else None,
        }
        rows.append(row)
        print(
            f"  step {row['step']}: RULER reward {row['ruler_reward']:.3f}  hidden check "
            f"{row['hidden_check']:.3f}  trainable groups {row['trainable_groups']:.0f}/"
            f"{len(groups)}  judge agrees on {step_agree}/{step_total} pairs"
        )
    after = await evaluate(model, held_out)
    print(f"  held-out code check at step {model.step}: {after.metrics['reward']:.3f}")
    return OracleRun(
        noise=judge.noise,
        before=before,
        after=after,
        steps=rows,
        judge_agreement=agree / total if total else float("nan"),
        tied_groups=judge.stats.tied_groups,
        judged_groups=judge.stats.groups,
        seconds=time.monotonic() - started,
    )


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    train_questions, held_out = split(args.train_questions, args.eval_size, seed=args.seed)
    backend = art.LocalBackend(path=args.path)
    model = smollm2_trainable(args.name or time.strftime("oracle-%Y%m%d-%H%M%S"), "ruler-oracle")
    print(f"Starting the backend (SmolLM2-135M-Instruct on CPU) under {args.path}/ ...")
    await model.register(backend)
    with OracleJudge(sum_check, noise=args.noise, tie_rate=args.tie_rate, seed=args.seed) as judge:
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
    history = await backend.history(model)
    minutes = (time.monotonic() - started) / 60
    folder = Path(args.path) / "ruler-oracle" / "models" / model.name / "report"
    report = write_report(
        folder,
        title="RULER rewards from an oracle judge: the held-out code check",
        description=(
            f"GRPO with RULER rewards only, {args.steps} steps of {args.groups_per_step} "
            f"questions x {args.rollouts_per_group} rollouts, CPU only, {minutes:.1f} minutes. "
            f"Oracle judge noise {args.noise}, tie rate {args.tie_rate}; it agreed with the "
            f"hidden check on {run.judge_agreement:.0%} of the pairs the check tells apart and "
            f"tied {run.tied_groups} of {run.judged_groups} groups. Held-out: the code check."
        ),
        before=run.before,
        after=run.after,
        history=history,
        settings={**vars(args), "minutes": round(minutes, 1)},
    )
    print_summary(run.before, run.after, report, examples=4, minutes=minutes)
    await backend.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The example's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--rollouts-per-group", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--tie-rate", type=float, default=0.1)
    parser.add_argument("--train-questions", type=int, default=200)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default=".art")
    parser.add_argument("--name", default=None, help="model name (default: a new one per run)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
