"""`make demo`: teach SmolLM2-135M-Instruct, on CPU, to answer small sums as one exact equation.

The whole loop a user writes: a rollout (plain OpenAI client code), a reward computed by code,
groups of rollouts per question, `model.train(groups)`, and a held-out evaluation before and
after. Writes a before/after table, a reward-curve PNG and an HTML report under `.art/`.

    python examples/demo.py [--steps 10] [--groups-per-step 8] [--rollouts-per-group 8]
                            [--min-trainable-groups N] [--max-groups-per-step 16]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_task import MAX_TOKENS, REWARD_RULE, Question, add_task_arguments, score, split
from smollm2 import smollm2_trainable
from tqdm.asyncio import tqdm

import art_core as art
from art_core.report import Evaluation, mean_metric, print_summary, summarize, write_report
from art_core.trackers import tracker_links
from art_core.trackers.trackio import TrackioObserver, trackio_installed

# Chosen by benchmarks/learning_curve.py (ours_auto vs ours_signal over 5 seeds, BENCHMARKS.md).
DEFAULT_MIN_TRAINABLE = 0  # off: ours_signal 0.27x vs ours_auto 0.255x (10 runs each)
TEMPERATURE = 1.0  # the training rollouts'; the held-out answers are greedy


def settings_sentence(args: argparse.Namespace) -> str:
    """The run's settings in one sentence: the report's, and docs/getting-started.md's for the
    defaults (a test compares them, so that the page follows the code)."""
    return (
        f"{args.steps} GRPO steps of {args.groups_per_step} questions x {args.rollouts_per_group} "
        f"rollouts (temperature {TEMPERATURE:g}, {MAX_TOKENS} new tokens), LoRA r16 on q/k/v/o, "
        f"lr {_short_float(args.learning_rate)}; held-out: {args.eval_size} other questions, answered "
        f"greedily at step 0, every {args.eval_every} steps and at the end."
    )


def _short_float(value: float) -> str:
    """3e-4 as `3e-4`, 2.5e-5 as `2.5e-5` (as the docs write a learning rate)."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def group_signal(args: argparse.Namespace) -> art.GroupSignal:
    """Groups whose rewards are all equal teach nothing. With `--min-trainable-groups N` a step
    samples more questions until N of its groups have mixed rewards, and questions that stayed
    all-equal are skipped. Off by default (measured: it cost more time than it saved); the
    signal then only counts such groups (the report's signal/... metrics), which also tells
    the trainer that this program chose, so it does not advise GroupSignal."""
    if not args.min_trainable_groups:
        return art.GroupSignal(skip_settled=False)
    return art.GroupSignal(
        min_trainable_groups=args.min_trainable_groups,
        max_groups_per_step=args.max_groups_per_step,
    )


async def rollout(model: art.TrainableModel, question: Question) -> art.Trajectory:
    """One attempt at one question: ask, score, return the trajectory."""
    messages = question.messages()
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=TEMPERATURE,
    )
    choice = response.choices[0]
    scores = score(question, choice.message.content or "")
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=scores.pop("reward"),
        metrics=scores,
        metadata={"question": question.text},
    )


async def evaluate(model: art.TrainableModel, held_out: list[Question]) -> Evaluation:
    """Greedy answers to the held-out questions, scored; logged as split "val"."""
    client = model.openai_client()

    async def answer(question: Question) -> tuple[Question, art.Trajectory]:
        response = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=question.messages(),  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            temperature=0.0,
        )
        choice = response.choices[0]
        scores = score(question, choice.message.content or "")
        trajectory = art.Trajectory(
            messages_and_choices=[*question.messages(), choice],
            reward=scores.pop("reward"),
            metrics=scores,
        )
        return question, trajectory

    answered = await tqdm.gather(
        *(answer(q) for q in held_out), desc=f"held-out at step {model.step}", leave=False
    )
    trajectories = [t for _, t in answered]
    await model.log([art.TrajectoryGroup(trajectories)], split="val")
    evaluation = summarize(
        model.step,
        [t.reward for t in trajectories],
        exact=[float(t.metrics["exact"]) for t in trajectories],
        format=[float(t.metrics["format"]) for t in trajectories],
        contains_answer=[float(t.metrics["contains_answer"]) for t in trajectories],
    )
    evaluation.examples = [
        {"prompt": q.text, "answer": t.messages()[-1].get("content"), "reward": t.reward}
        for q, t in answered[:12]
    ]
    return evaluation


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    train_questions, held_out = split(args.train_questions, args.eval_size, seed=args.seed)
    backend = art.LocalBackend(path=args.path)
    model = smollm2_trainable(args.name or time.strftime("arith-%Y%m%d-%H%M%S"), "demo")
    if trackio_installed():  # local, no account: `trackio show --project demo` shows the run
        model.observers.append(TrackioObserver())
    print(f"Starting the backend (SmolLM2-135M-Instruct on CPU) under {args.path}/ ...")
    await model.register(backend)
    config = art.TrainConfig(learning_rate=args.learning_rate)
    print(f"Model {model.name}: evaluating {len(held_out)} held-out questions at step {model.step}")
    before = await evaluate(model, held_out)
    print(f"  held-out reward {before.metrics['reward']:.3f}, exact {before.metrics['exact']:.3f}")

    signal = group_signal(args)
    for batch in art.iterate_dataset(
        train_questions,
        args.groups_per_step,
        num_epochs=100,
        initial_step=model.step,
        use_tqdm=False,
        signal=signal,
    ):
        if batch.step >= args.steps:
            break
        groups = await art.gather_trajectory_groups(
            batch.groups(
                lambda q: art.TrajectoryGroup(
                    rollout(model, q) for _ in range(args.rollouts_per_group)
                )
            ),
            pbar_desc=f"step {batch.step + 1}/{args.steps}",
            max_exceptions=0.1,
        )
        result = await model.train(groups, config=config)
        m = result.metrics
        extra = f" ({m['signal/extra_groups']:.0f} extra)" if m.get("signal/extra_groups") else ""
        print(
            f"  step {result.step}: train reward {m['reward']:.3f}  exact "
            f"{mean_metric(groups, 'exact'):.2f}  trainable groups {m['groups/trainable']:.0f}/"
            f"{m['groups/submitted']:.0f}{extra}  {m.get('step_seconds', 0):.1f}s train"
        )
        if args.eval_every and result.step % args.eval_every == 0 and result.step < args.steps:
            middle = await evaluate(model, held_out)
            print(f"  held-out reward at step {result.step}: {middle.metrics['reward']:.3f}")

    after = await evaluate(model, held_out)
    history = await backend.history(model)
    await model.delete_checkpoints("val/reward")
    minutes = (time.monotonic() - started) / 60
    folder = Path(args.path) / "demo" / "models" / model.name / "report"
    report = write_report(
        folder,
        title="SmolLM2-135M-Instruct learns to answer sums as one exact equation",
        description=(
            f"{settings_sentence(args)} CPU only, {minutes:.1f} minutes in all. "
            f"Reward: {REWARD_RULE}."
        ),
        before=before,
        after=after,
        history=history,
        settings={**vars(args), "minutes": round(minutes, 1)},
        trackers=tracker_links(model.observers, model),
    )
    print_summary(
        before, after, report, examples=4, minutes=minutes,
        trackers=tracker_links(model.observers, model),
    )  # fmt: skip
    await backend.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_task_arguments(parser, eval_every=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default=".art")
    parser.add_argument("--name", default=None, help="model name (default: a new one per run)")
    parser.add_argument(
        "--min-trainable-groups",
        type=int,
        default=DEFAULT_MIN_TRAINABLE,
        help="art.GroupSignal: sample more questions until a step has this many groups with "
        "mixed rewards (0: off)",
    )
    parser.add_argument(
        "--max-groups-per-step", type=int, default=16, help="art.GroupSignal's bound"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
