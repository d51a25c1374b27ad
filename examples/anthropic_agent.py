"""Train a two-turn tool agent written with the plain `anthropic` SDK, SmolLM2 on CPU.

The agent is ordinary Anthropic SDK code (`AsyncAnthropic`, a `multiply` tool with an
`input_schema`, a tool loop): the model calls the tool, gets its `tool_result`, answers. What is
art-specific is the scope around each run, `async with model.rollout() as r:`, and the base URL
it gives the client: every Messages call in the scope is recorded with its exact tokens, and the
run becomes one trajectory. The SDK appends `/v1/messages` itself, so the client gets
`r.base_url` without its `/v1`.

The task: "What is 7 times 8?" with the `multiply` tool, answered with just the number. The
reward is checked by code: 1 for a final answer that is just the product; else 0.5 for calling
`multiply` with the right two numbers plus 0.25 for the product somewhere in the answer. The
first turn must call a tool (`tool_choice` `any`: unforced, SmolLM2-135M called it in none of 16
runs); which arguments, and what to answer with the result, are the model's. Held-out pairs
of numbers never appear in training; they are answered greedily before and after training.
The measured before/after: docs/anthropic.md.

    python examples/anthropic_agent.py [--steps 5] [--groups-per-step 4] [--rollouts-per-group 4]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time
from dataclasses import dataclass
from typing import Any

import anthropic
from anthropic.types import MessageParam, ToolChoiceParam, ToolParam, ToolResultBlockParam

import art_core as art

SYSTEM = "You multiply numbers with the multiply tool, then answer with just the number."
MULTIPLY_TOOL: ToolParam = {
    "name": "multiply",
    "description": "Multiply two integers and return the product.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
PHRASINGS = ["What is {a} times {b}?", "Multiply {a} by {b}.", "How much is {a} * {b}?"]


@dataclass(frozen=True)
class Question:
    a: int
    b: int
    phrasing: str

    @property
    def text(self) -> str:
        return self.phrasing.format(a=self.a, b=self.b)


def split(eval_size: int, seed: int) -> tuple[list[Question], list[Question]]:
    """Questions on pairs of 2..19; the held-out pairs never appear in training."""
    pairs = [(a, b) for a in range(2, 20) for b in range(2, 20) if a <= b]
    random.Random(seed).shuffle(pairs)
    held_out, train = pairs[:eval_size], pairs[eval_size:]

    def ask(pairs: list[tuple[int, int]]) -> list[Question]:
        return [Question(a, b, PHRASINGS[(a + b) % len(PHRASINGS)]) for a, b in pairs]

    return ask(train), ask(held_out)


def multiply(tool_input: dict[str, Any]) -> str:
    """The tool itself: the product, or the error the model reads back."""
    try:
        return str(int(tool_input["a"]) * int(tool_input["b"]))
    except (KeyError, TypeError, ValueError) as error:
        return f"error: {error!r}"


async def run_agent(
    client: anthropic.AsyncAnthropic, model: str, question: Question, *, temperature: float,
    max_tokens: int,
) -> tuple[list[dict[str, Any]], str]:  # fmt: skip
    """The agent, as an SDK user writes it: up to two turns, running each `tool_use` and
    sending its `tool_result` back. Returns the tool inputs it called with and its final text."""
    messages: list[MessageParam] = [{"role": "user", "content": question.text}]
    tool_choice: ToolChoiceParam = {"type": "any", "disable_parallel_tool_use": True}
    calls: list[dict[str, Any]] = []
    for _ in range(2):
        answer = await client.messages.create(
            model=model,
            max_tokens=max_tokens,
            system=SYSTEM,
            messages=messages,
            tools=[MULTIPLY_TOOL],
            tool_choice=tool_choice,
            extra_body={"temperature": temperature},  # this SDK's create() does not name it
        )
        messages.append({"role": "assistant", "content": answer.content})
        uses = [block for block in answer.content if block.type == "tool_use"]
        if answer.stop_reason != "tool_use" or not uses:
            break
        calls += [dict(block.input) for block in uses if block.name == "multiply"]
        results: list[ToolResultBlockParam] = [
            {"type": "tool_result", "tool_use_id": block.id, "content": multiply(block.input)}
            for block in uses
        ]
        messages.append({"role": "user", "content": results})
        tool_choice = {"type": "auto"}
    final = "".join(block.text for block in answer.content if block.type == "text")
    return calls, final


def score(question: Question, calls: list[dict[str, Any]], final: str) -> dict[str, float]:
    """1 for a final answer that is just the product; else 0.5 for calling `multiply` with the
    right two numbers, plus 0.25 for the product somewhere in the answer."""
    product = str(question.a * question.b)
    pair = {(question.a, question.b), (question.b, question.a)}
    right_call = any((call.get("a"), call.get("b")) in pair for call in calls)
    exact = final.strip().rstrip(".") == product
    contains = product in re.findall(r"-?\d+", final)
    reward = 1.0 if exact else 0.5 * right_call + 0.25 * contains
    return {
        "reward": reward,
        "right_call": float(right_call),
        "exact": float(exact),
        "contains": float(contains),
    }


async def rollout(
    model: art.TrainableModel, question: Question, *, temperature: float, max_tokens: int
) -> art.Trajectory:
    """One run of the agent in a capture scope: its Messages calls become the trajectory."""
    async with model.rollout() as r:
        # The SDK appends /v1/messages itself: the scope's URL without its /v1.
        async with anthropic.AsyncAnthropic(
            base_url=r.base_url.removesuffix("/v1"), api_key=r.api_key, max_retries=0
        ) as client:
            calls, final = await run_agent(
                client, r.model, question, temperature=temperature, max_tokens=max_tokens
            )
        scores = score(question, calls, final)
        r.reward = scores.pop("reward")
        r.metrics = scores
        r.metadata = {"question": question.text, "answer": final}
    return r.trajectory


async def evaluate(
    model: art.TrainableModel, held_out: list[Question], max_tokens: int
) -> dict[str, float]:
    """Greedy runs on the held-out questions: the mean reward and the share of each part."""
    trajectories = await asyncio.gather(
        *(rollout(model, q, temperature=0.0, max_tokens=max_tokens) for q in held_out)
    )
    await model.log([art.TrajectoryGroup(trajectories)], split="val")
    return {
        "reward": sum(t.reward for t in trajectories) / len(trajectories),
        "right_call": sum(t.metrics["right_call"] for t in trajectories) / len(trajectories),
        "exact": sum(t.metrics["exact"] for t in trajectories) / len(trajectories),
        "contains": sum(t.metrics["contains"] for t in trajectories) / len(trajectories),
    }


def describe(label: str, evaluation: dict[str, float]) -> str:
    return (
        f"{label}: held-out mean reward {evaluation['reward']:.3f}, right tool call "
        f"{evaluation['right_call']:.3f}, answer just the product {evaluation['exact']:.3f}, "
        f"product in the answer {evaluation['contains']:.3f}"
    )


async def main(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    started = time.monotonic()
    train_questions, held_out = split(args.eval_size, args.seed)
    backend = art.LocalBackend(path=args.path)
    model = art.TrainableModel(
        name=args.name or time.strftime("anthropic-agent-%Y%m%d-%H%M%S"),
        project="anthropic-agent",
        base_model=args.base_model,
        lora=art.LoRAConfig(r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )  # fmt: skip
    try:
        await model.register(backend)
        before = await evaluate(model, held_out, args.max_tokens)
        print(describe(f"step {model.step}", before), flush=True)
        config = art.TrainConfig(learning_rate=args.learning_rate)
        for batch in art.iterate_dataset(
            train_questions, args.groups_per_step, num_epochs=100, initial_step=model.step,
            use_tqdm=False,
        ):  # fmt: skip
            if batch.step >= args.steps:
                break
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        rollout(model, q, temperature=1.0, max_tokens=args.max_tokens)
                        for _ in range(args.rollouts_per_group)
                    )
                    for q in batch.items
                ),
                pbar_desc=f"step {batch.step + 1}/{args.steps}",
                max_exceptions=0.1,
            )
            result = await model.train(groups, config=config)
            print(
                f"  step {result.step}: train reward {result.metrics['reward']:.3f}, trainable "
                f"groups {result.metrics['groups/trainable']:.0f}/"
                f"{result.metrics['groups/submitted']:.0f}",
                flush=True,
            )
        after = await evaluate(model, held_out, args.max_tokens)
    finally:
        await backend.close()
    print(describe(f"before (step 0, {len(held_out)} questions)", before))
    print(describe(f"after (step {model.step})", after))
    print(f"{(time.monotonic() - started) / 60:.1f} minutes in all")
    return {"before": before, "after": after}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--max-tokens", type=int, default=40, help="per turn")
    parser.add_argument("--eval-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default=".art")
    parser.add_argument("--name", default=None, help="model name (default: a new one per run)")
    parser.add_argument(
        "--base-model", default="smollm2-135m-instruct", help="the tests pass the tiny model"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
