"""SmolLM2-135M-Instruct as a RULER judge: a measurement, not an assertion of quality.

Groups of two answers to a small sum, one right and one plainly wrong, shown in both orders.
The test checks that every judgement is a valid answer (constrained decoding) and prints how
often the right answer scores higher; docs/rewards.md records the number.

    make test-slow   # or: pytest -m slow tests/core/test_ruler_slow.py -s
"""

from __future__ import annotations

import asyncio
import random

import pytest

import art_core as art

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

RUBRIC = "The answer must give the correct result of the sum. A wrong result scores 0."


async def test_smollm2_ranks_a_right_and_a_wrong_answer(tmp_path):
    backend = art.LocalBackend(path=tmp_path / "art")
    policy = art.TrainableModel(name="judge-check", base_model="smollm2-135m-instruct")
    await policy.register(backend)
    judge = art.Model(name="smollm2-135m-instruct")
    await judge.register(backend)
    rng = random.Random(0)
    pairs = []
    for _ in range(12):
        a, b = rng.randint(10, 60), rng.randint(10, 60)
        question = [{"role": "user", "content": f"What is {a} + {b}?"}]
        right = [*question, {"role": "assistant", "content": f"{a} + {b} = {a + b}"}]
        wrong = [*question, {"role": "assistant", "content": f"{a} + {b} = {a + b + 17}"}]
        pairs += [(right, wrong, 0), (wrong, right, 1)]
    usage = art.JudgeUsage()
    try:
        # all at once: the backend decodes the judgements in one batch
        results = await asyncio.gather(
            *(
                art.ruler(
                    [first, second],
                    judge,
                    RUBRIC,
                    cache=False,
                    usage=usage,
                    sampling={"temperature": 0.0},
                )
                for first, second, _ in pairs
            )
        )
    finally:
        await backend.close()
    correct = ties = 0
    for (_, _, right_index), scores in zip(pairs, results, strict=True):
        assert len(scores) == 2 and all(0 <= s.score <= 1 for s in scores)
        right, wrong = scores[right_index].score, scores[1 - right_index].score
        correct += right > wrong
        ties += right == wrong
    print(
        f"\nSmolLM2-135M as judge: right answer ranked higher in {correct}/{len(pairs)} groups, "
        f"{ties} ties; {usage.requests} requests, {usage.reasks} re-asks, "
        f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens"
    )
