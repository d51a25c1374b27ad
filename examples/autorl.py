"""AutoRL: train SmolLM2-135M-Instruct from one paragraph, with no data and no reward code.

The generator writes the training and held-out inputs, RULER (an LLM judge ranking each group of
answers) gives the rewards, GRPO trains a LoRA adapter, and the report is the demo's.

    python examples/autorl.py                                 # judge: the base model, offline
    python examples/autorl.py --judge openai/gpt-4.1-mini     # a hosted judge (OPENAI_API_KEY)

By default the judge and the generator are SmolLM2-135M-Instruct itself, served by the same
backend, so this runs offline on a laptop CPU. A 135M judge is a weak judge: its scores are noisy
and the report says so; a stronger judge (any OpenAI-compatible model) gives better rewards.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2 import smollm2_trainable

import art_core as art
from art_core.report import print_summary

TASK = (
    "You are the assistant of Rolling Wheels, a bike shop open 9am to 6pm Monday to Saturday and "
    "closed on Sunday. Customers write short questions about opening hours, repairs, rentals and "
    "prices. Reply in one or two friendly sentences that answer the question directly and, when "
    "it is about when to come in, state the opening hours."
)


async def main(args: argparse.Namespace) -> None:
    backend = art.LocalBackend(path=args.path)
    model = smollm2_trainable(args.name or time.strftime("autorl-%Y%m%d-%H%M%S"), "autorl")
    print(f"Starting the backend (SmolLM2-135M-Instruct on CPU) under {args.path}/ ...")
    await model.register(backend)
    judge = await art.judge_or_base_model(args.judge, backend, "smollm2-135m-instruct")
    result = await art.autorl(
        TASK,
        model,
        judge=judge,
        steps=args.steps,
        groups_per_step=args.groups_per_step,
        rollouts_per_group=args.rollouts_per_group,
        num_scenarios=args.scenarios,
        max_tokens=args.max_tokens,
        config=art.TrainConfig(learning_rate=args.learning_rate),
        # a small local generator writes better at a lower temperature; more, smaller batches
        # decode together on the backend
        generation_options={
            "sampling": {"temperature": 0.7, "top_p": 0.9},
            "batch_size": 3,
            "concurrency": 8,
        },
        report_dir=Path(args.path) / "autorl" / "models" / model.name / "report",
    )
    print_summary(result.before, result.after, result.report)
    print(f"\nJudge and generator: {result.judge_usage.summary()}")
    await backend.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--judge", default=None, help="'<provider>/<model>' (default: the base model)"
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--scenarios", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--path", default=".art")
    parser.add_argument("--name", default=None)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
