"""The Tinker API's rows (`_target_rows`) packed over their shared prefixes: the units, the
layout, and scores and gradients equal to the padded forward's (`LoraTrainer.score_targets`)."""

from __future__ import annotations

import pytest
import torch

from art_backend.training._target_rows import (
    TargetBatch,
    TargetPack,
    TargetRow,
    packed_target_logprobs,
    prefix_units,
    target_batches,
)
from tests.support.trainers import twin_trainers

SYSTEM = [5, 6, 7, 8, 9, 10]  # a system prompt every row begins with


def datum(tokens: list[int]) -> TargetRow:
    return TargetRow(input_ids=tokens[:-1], target_ids=tokens[1:])


def group(prompt: list[int], completions: list[list[int]]) -> list[TargetRow]:
    return [datum(SYSTEM + prompt + completion) for completion in completions]


def cookbook_batch() -> list[TargetRow]:
    """Two prompts' samples, interleaved as a caller may send them, and an unrelated row."""
    first = group([20, 21, 22, 23, 24], [[40, 41, 42], [40, 43], [44, 45, 46, 47], [48, 49]])
    second = group([30, 31, 32, 33], [[50, 51], [52, 53, 54], [55, 56, 57]])
    lone = [datum([60, 61, 62, 63, 64, 65, 66])]
    return [first[0], second[0], first[1], lone[0], second[1], first[2], second[2], first[3]]


def test_a_prompts_samples_form_one_unit_and_a_shorter_common_prefix_does_not_merge_prompts():
    rows = cookbook_batch()
    units = prefix_units(rows, token_budget=1000)
    members = sorted(sorted(m) for _, m in units)
    assert members == [[0, 2, 5, 7], [1, 4, 6], [3]]
    shared = {tuple(sorted(m)): s for s, m in units}
    # The prompt and the first sampled token where every sample has it: up to the last prompt
    # token (inputs are tokens[:-1]); the system prompt alone would pack more tokens.
    assert shared[(0, 2, 5, 7)] == len(SYSTEM) + 5
    assert shared[(1, 4, 6)] == len(SYSTEM) + 4
    assert shared[(3,)] == 6  # a unit of one row is all prefix


def test_rows_that_share_only_a_short_prefix_pack_when_it_saves_tokens():
    rows = [datum([1, 2, 3, 4]), datum([1, 9, 9, 9])]
    assert sorted(prefix_units(rows, token_budget=100)[0][1]) == [0, 1]  # 1 + 2 + 2 < 3 + 3
    rows = [datum([1, 2, 3]), datum([7, 2, 3])]
    assert len(prefix_units(rows, token_budget=100)) == 2  # nothing in common


def test_a_unit_stays_within_the_budget_and_identical_rows_share_everything():
    rows = group([20, 21, 22, 23, 24], [[40, 41, 42], [40, 43, 44], [45, 46, 47], [48, 49, 50]])
    units = prefix_units(rows, token_budget=18)
    assert [m for _, m in units] == [[0, 1, 2], [3]]
    assert all(s + sum(len(rows[i].input_ids) - s for i in m) <= 18 for s, m in units)
    same = [datum([1, 2, 3, 4, 5])] * 3
    (unit,) = prefix_units(same, token_budget=100)
    assert unit == (4, [0, 1, 2])  # every row is the prefix; no remainders


def test_the_packed_layout_gives_each_row_its_own_positions_and_targets():
    rows = cookbook_batch()
    (batch,) = target_batches(rows, token_budget=1000, pack=True)
    assert isinstance(batch, TargetPack)
    assert sorted(batch.indices) == list(range(len(rows)))
    width = batch.input_ids.shape[1]
    flat_ids = batch.input_ids.reshape(-1)
    flat_positions = batch.position_ids.reshape(-1)
    for line, index in enumerate(batch.indices):
        length = len(rows[index].input_ids)
        where = batch.where[line, :length]
        assert flat_ids[where].tolist() == rows[index].input_ids
        assert flat_positions[where].tolist() == list(range(length))
        assert batch.target_ids[line, :length].tolist() == rows[index].target_ids
        assert len({int(w) // width for w in where}) == 1  # one packed row holds it
    assert batch.processed_tokens < sum(len(row.input_ids) for row in rows)


def test_without_packing_or_without_shared_prefixes_the_batches_are_padded_rows():
    rows = cookbook_batch()
    assert all(isinstance(b, TargetBatch) for b in target_batches(rows, token_budget=1000))
    unrelated = [datum([1, 2, 3]), datum([4, 5, 6, 7])]
    batches = target_batches(unrelated, token_budget=1000, pack=True)
    assert all(isinstance(b, TargetBatch) for b in batches)
    with pytest.raises(ValueError, match="token_budget"):
        target_batches(rows, token_budget=0, pack=True)


def test_logits_that_do_not_cover_every_packed_position_are_refused():
    (batch,) = target_batches(cookbook_batch(), token_budget=1000, pack=True)
    rows, width = batch.input_ids.shape
    with pytest.raises(ValueError, match="every packed position"):
        packed_target_logprobs(torch.zeros(rows, width - 1, 8), batch)


@pytest.fixture(scope="module")
def trainers(tmp_path_factory: pytest.TempPathFactory):
    """Two trainers from the same seed on one engine, one packing and one not."""
    packed, padded = twin_trainers(tmp_path_factory.mktemp("target-packing"), seed=3)
    for trainer in (packed, padded):  # a trained-looking adapter, so the LoRA shapes the scores
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(0)
            for param in trainer.params:
                param.normal_(std=0.2)
    return packed, padded


@pytest.mark.parametrize("budget", [1000, 16])  # 16: the first prompt's samples make two units
def test_packed_scores_and_gradients_equal_the_padded_forwards(trainers, budget: int):
    """The cookbook's datums through `score_targets`: every row's logprobs, its elementwise
    loss and the accumulated gradient are the padded forward's, and so is the step after."""
    from art_backend.testing import OptimizerSettings

    packed, padded = trainers
    rows = cookbook_batch()
    weights = [
        torch.linspace(-1.0, 1.0, len(row.input_ids)) * (i + 1) for i, row in enumerate(rows)
    ]

    def loss(index: int, logprobs: torch.Tensor) -> torch.Tensor:
        return -weights[index] * logprobs

    batches = target_batches(rows, token_budget=budget, pack=True)
    assert any(isinstance(b, TargetPack) for b in batches)
    scored = {}
    for trainer in (packed, padded):
        scored[trainer.adapter_name] = trainer.score_targets(
            rows, loss, backward=True, token_budget=budget
        )
    for kind in (0, 1):  # logprobs, then elementwise losses
        for a, b in zip(scored["packed"][kind], scored["padded"][kind], strict=True):
            assert a.shape == b.shape
            assert torch.allclose(a, b, atol=1e-5)
    assert all(float(values.abs().sum()) > 0 for values in scored["packed"][0])
    for a, b in zip(packed.params, padded.params, strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4)
    settings = OptimizerSettings(learning_rate=1e-2)
    norms = [trainer.apply_gradients(settings) for trainer in (packed, padded)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-4) and norms[0] > 0
    for a, b in zip(packed.params, padded.params, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
