"""The demo task: small sums, answered as one equation and nothing else; the reward is exact.

Measured on SmolLM2-135M-Instruct (greedy, 64 held-out questions): asked for "3 + 4 = 7" and
nothing else, it answers "To add 3 and 18, we can use the concept of..." and has the right sum
in its reply 6% of the time, never in the asked form. Sampled at temperature 1 it sometimes
writes the equation ("11 + 8 = 19") and then goes on. The reward pays 1 for exactly the
equation with the right sum, 0.5 for the right sum among other text, 0 otherwise: the format is
learnable from its own samples, the arithmetic is what the model already half knows.
Used by `examples/demo.py` and by `benchmarks/learning_curve.py`.
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass

SYSTEM_PROMPT = "Reply with the sum written as an equation, like 3 + 4 = 7, and nothing else."
MAX_TOKENS = 16
# What `score` pays, in words (the demo's report and docs/getting-started.md say it; a test checks
# both against `score`).
REWARD_RULE = (
    '1 for exactly the equation "a + b = sum" with the right sum, 0.5 for the right sum among '
    "other text, 0 otherwise"
)


@dataclass(frozen=True)
class Question:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def text(self) -> str:
        return f"What is {self.a} + {self.b}?"

    def messages(self) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.text},
        ]


def questions(count: int, *, seed: int, low: int = 1, high: int = 19) -> list[Question]:
    """Distinct random questions with operands in [low, high]."""
    rng = random.Random(seed)
    pool = [Question(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    return rng.sample(pool, count)


def split(
    train_count: int, test_count: int, seed: int = 0
) -> tuple[list[Question], list[Question]]:
    """Disjoint train and held-out questions."""
    everything = questions(train_count + test_count, seed=seed)
    return everything[:train_count], everything[train_count:]


_INTEGER = re.compile(r"-?\d+")
_EQUATION = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*(-?\d+)\s*\.?\s*")


def score(question: Question, reply: str) -> dict[str, float]:
    """reward: 1 for exactly "a + b = sum", 0.5 for the right sum among other text, else 0."""
    equation = _EQUATION.fullmatch(reply)
    in_form = bool(equation) and {int(equation[1]), int(equation[2])} == {question.a, question.b}
    exact = in_form and int(equation[3]) == question.answer  # type: ignore[index]
    contains = question.answer in [int(n) for n in _INTEGER.findall(reply)]
    reward = 1.0 if exact else 0.5 if contains else 0.0
    return {
        "reward": reward,
        "exact": float(exact),
        "format": float(in_form),
        "contains_answer": float(contains),
    }


def add_task_arguments(parser: argparse.ArgumentParser, *, eval_every: int) -> None:
    """The demo task's training settings, declared once for `demo.py` and the benchmarks that
    compare against it (`learning_curve.py`, TRL's side in `_trl_learning_curve.py`), so "the
    same settings" is one definition rather than three copies."""
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--rollouts-per-group", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--train-questions", type=int, default=200)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=eval_every)
