"""Prefill groups: prompts of similar lengths share a forward, the same prompt is prefilled
once, and the tokens are those of prompts decoded alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from art_backend.engines._prefill_groups import prefill_groups
from tests.server.engines.test_engine import (
    greedy,
    reference_generate,
    run,
    started_engine,
    tokenizer,  # noqa: F401 (a fixture)
)
from tests.support.adapters import load_model


def request(length: int, adapter: str | None = None, first: int = 0) -> SimpleNamespace:
    return SimpleNamespace(prompt_ids=list(range(first, first + length)), adapter=adapter)


def lengths(groups: list[list[SimpleNamespace]]) -> list[list[int]]:
    return [[len(r.prompt_ids) for r in group] for group in groups]


def test_a_spread_of_lengths_splits_where_padding_would_pass_the_slack():
    spread = [request(n) for n in (20, 120, 26, 113, 60)]
    groups = prefill_groups(spread)
    assert lengths(groups) == [[120, 113, 60], [20, 26]]  # request order kept inside a group
    for group in groups:  # every group within the slack: padded positions / real tokens
        longest = max(len(r.prompt_ids) for r in group)
        assert longest * len(group) <= 1.25 * sum(len(r.prompt_ids) for r in group)
    assert sorted(id(r) for g in groups for r in g) == sorted(id(r) for r in spread)


def test_equal_lengths_stay_one_group_and_the_slack_bounds_them():
    same = [request(50, first=i) for i in range(6)]
    assert lengths(prefill_groups(same)) == [[50] * 6]
    assert len(prefill_groups([request(100), request(99)], slack=1.0)) == 2
    assert len(prefill_groups([request(100), request(10)], slack=10.0)) == 1


def test_requests_for_the_same_prompt_and_adapter_are_never_split():
    # Seven copies of one prompt beside a longer one: the copies' shared prefill is kept even
    # where the longer prompt's group could take only some of them.
    shared = [request(40) for _ in range(7)]
    groups = prefill_groups([request(48), *shared, request(40, adapter="other")])
    together = [g for g in groups if any(r is shared[0] for r in g)]
    assert len(together) == 1 and all(r in together[0] for r in shared)


async def test_a_spread_batch_prefills_in_groups_and_decodes_as_alone(
    tiny_model_dir: Path,
    tokenizer,  # noqa: F811 (the fixture)
):
    engine = started_engine(tiny_model_dir, tokenizer, max_batch_size=16)
    prompts = [[5 + (i * 7 + j) % 90 for j in range(n)] for i, n in enumerate((4, 60, 9, 55, 30))]
    try:
        with engine.exclusive():  # all five wait, then are admitted together
            tasks = [asyncio.create_task(run(engine, greedy(ids, 6))) for ids in prompts]
            await asyncio.sleep(0.1)
        results = await asyncio.gather(*tasks)
    finally:
        engine.stop()
    assert engine.metrics.prefill_batches_total == len(prefill_groups(
        [SimpleNamespace(prompt_ids=ids, adapter=None) for ids in prompts]
    )) > 1  # fmt: skip
    reference = load_model(tiny_model_dir)
    for ids, finished in zip(prompts, results, strict=True):
        assert finished[0].token_ids == reference_generate(reference, ids, 6, -1)
