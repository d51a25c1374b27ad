"""Train with a person in the loop: each step waits on the review page until someone approves it.

Each step's groups are held for review (`review_hold_seconds`); open the printed link, look at
the groups, flag what the trainer should not learn from (a trajectory or a whole group) or
override a reward, then press "Approve now" (or let the hold expire). The step then trains
without the flagged runs and counts them in its metrics. Run:

    python examples/review_hold.py --steps 2 --hold 600

or open the page from another terminal, over the same folder, without the API key:

    art review --path .art --port 8080     # http://127.0.0.1:8080/review/
"""

from __future__ import annotations

import argparse
import asyncio
import random

import art_core as art


async def rollout(model: art.TrainableModel, a: int, b: int) -> art.Trajectory:
    """One answer to `a + b`: reward 1 for exactly the sum, 0.5 for the sum among other text."""
    messages = [
        {"role": "system", "content": "Answer with just the number."},
        {"role": "user", "content": f"What is {a} + {b}?"},
    ]
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=1.0,
    )
    choice = completion.choices[0]
    text = (choice.message.content or "").strip()
    reward = 1.0 if text == str(a + b) else (0.5 if str(a + b) in text else 0.0)
    trajectory = art.Trajectory(messages_and_choices=[*messages, choice], reward=reward)
    trajectory.log(f"expected {a + b}, answered {text!r}")  # shown on the review page
    trajectory.metrics["answer_chars"] = len(text)  # filterable on the review page
    return trajectory


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--hold", type=float, default=600, help="seconds each step waits")
    parser.add_argument("--groups", type=int, default=4, help="questions per step")
    parser.add_argument("--rollouts", type=int, default=4, help="answers per question")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base model")
    parser.add_argument("--path", default=".art")
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    backend = art.LocalBackend(path=args.path)
    model = art.TrainableModel(name="review-001", project="review-demo", base_model=args.model)
    await model.register(backend)
    # LocalBackend protects its server with a random key: the link logs the browser in once.
    print(f"review page: {backend.base_url}/review/?key={backend.api_key}", flush=True)
    for _ in range(args.steps):
        questions = [(random.randint(1, 20), random.randint(1, 20)) for _ in range(args.groups)]
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, a, b) for _ in range(args.rollouts))
                for a, b in questions
            ),
            pbar_desc="gather",
        )
        print(f"step {model.step}: held for review, up to {args.hold:g} s", flush=True)
        config = art.TrainConfig(learning_rate=1e-4, review_hold_seconds=args.hold)
        result = await model.train(groups, config=config)
        review = {k: v for k, v in result.metrics.items() if k.startswith("review/")}
        print(f"now at step {result.step}: reward {result.metrics['reward']:.3f}, {review}")
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
