"""The classic ART example, written exactly as an ART user writes it: only the import differs.

A random `a * b` question; reward +1 for the right product, -1 otherwise. Run:

    python examples/multiplication.py --steps 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re

import art_core as art  # with OpenPipe ART: `import art`


async def rollout(model: art.TrainableModel, step: int) -> art.Trajectory:
    a, b = random.randint(1, 12), random.randint(1, 12)
    messages = [
        {"role": "system", "content": "Answer with just the number."},
        {"role": "user", "content": f"What is {a} * {b}?"},
    ]
    client = model.openai_client()
    completion = await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=1.0,
    )
    choice = completion.choices[0]
    numbers = re.findall(r"-?\d+", choice.message.content or "")
    correct = bool(numbers) and int(numbers[-1]) == a * b
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=1.0 if correct else -1.0,
        metrics={"correct": correct},
        metadata={"step": step},
    )


async def main(steps: int, path: str) -> None:
    random.seed(0)
    backend = art.LocalBackend(path=path)
    model = art.TrainableModel(
        name="multiplication-001", project="examples", base_model="smollm2-135m-instruct"
    )
    await model.register(backend)
    for step in range(await model.get_step(), steps):
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, step) for _ in range(8)) for _ in range(4)),
            pbar_desc=f"gather step {step}",
            max_exceptions=0.1,
        )
        # ART 0.5.23's backend-first form: train, then log the step's metrics yourself.
        result = await backend.train(model, groups, learning_rate=1e-4)
        await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        print(f"step {result.step}: reward {result.metrics['reward']:.3f}")
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--path", default=".art")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.steps, arguments.path))
