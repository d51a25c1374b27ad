"""The demo task: small arithmetic, answered with just the number; the reward is exact.

SmolLM2-135M-Instruct knows many small sums but never answers with just the number: it writes
"7 + 7 = 14. Here's why..." So the reward pays for the right number, and most for the right
number alone. Used by `examples/demo.py` and by `benchmarks/learning_curve.py`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

SYSTEM_PROMPT = "You are a calculator. Reply with only the final number, nothing else."
MAX_TOKENS = 16


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


def score(question: Question, reply: str) -> dict[str, float]:
    """reward: 1 for exactly the right number, 0.5 for the right number among other text, else 0."""
    text = reply.strip().rstrip(".")
    just_a_number = bool(re.fullmatch(r"-?\d+", text))
    numbers = [int(n) for n in _INTEGER.findall(reply)]
    contains = question.answer in numbers
    exact = just_a_number and int(text) == question.answer
    reward = 1.0 if exact else 0.5 if contains else 0.0
    return {
        "reward": reward,
        "exact": float(exact),
        "format": float(just_a_number),
        "contains_answer": float(contains),
    }
