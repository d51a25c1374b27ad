"""Shared-prefix packing: the packed forward gives the padded forward's logprobs and gradients."""

from __future__ import annotations

import types

import pytest
import torch

from art_backend.training._packing import (
    PackedBatch,
    packed_logprobs_and_entropy,
    packed_micro_batches,
    packing_supported,
    shared_prefix_units,
)
from art_backend.training._rows import Rows, Sequence, pack_rows, token_logprobs_and_entropy
from tests.support.tiny_model import build_tiny_model


def seq(tokens: list[int], trained_from: int, *, group: int, advantage: float = 1.0) -> Sequence:
    """A sequence whose tokens from `trained_from` on were sampled."""
    mask = torch.zeros(len(tokens), dtype=torch.bool)
    mask[trained_from:] = True
    return Sequence(
        input_ids=torch.tensor(tokens),
        trained_mask=mask,
        old_logprobs=torch.where(mask, -0.5, 0.0),
        advantage=advantage,
        trajectory_id=f"t{group}-{tokens[-1]}",
        group_id=group,
        truncated=False,
    )


def rows_of(*sequences: Sequence) -> Rows:
    rows, dropped = pack_rows(sequences, max_length=10_000, mask_truncated=False)
    assert not any(dropped.values())
    return rows


def mixed_rows() -> Rows:
    """Group 1: three samples of one 12-token prompt; group 2: two multi-turn rows whose second
    prompts differ (a tool result) and whose first turns differ at token 9; group 3 alone."""
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    return rows_of(
        seq([*prompt, 30, 31, 32], 12, group=1, advantage=1.0),
        seq([*prompt, 33, 34], 12, group=1, advantage=-1.0),
        seq([*prompt, 30, 35, 36, 37, 38], 12, group=1, advantage=0.5),
        seq([5, 6, 7, 8, 9, 20, 21, 22, 23, 40, 41, 42, 43, 44], 9, group=2, advantage=0.7),
        seq([5, 6, 7, 8, 9, 20, 21, 22, 23, 45, 46, 47], 9, group=2, advantage=-0.7),
        seq([5, 6, 7, 50, 51], 3, group=3, advantage=0.2),
    )


def test_a_group_shares_its_prompt_up_to_the_first_trained_token():
    rows = mixed_rows()
    units = shared_prefix_units(rows, token_budget=1000)
    assert units == [(12, [0, 1, 2]), (9, [3, 4]), (0, [5])]


def test_the_prefix_stops_where_the_rows_differ_or_one_of_them_is_trained():
    # Identical first sampled tokens are not shared: each row trains its own (own advantage).
    rows = rows_of(seq([1, 2, 3, 4, 9, 9], 4, group=0), seq([1, 2, 3, 4, 9, 8], 4, group=0))
    assert shared_prefix_units(rows, token_budget=100) == [(4, [0, 1])]
    # The rows differ at column 2 before anything is trained: only two tokens are shared.
    rows = rows_of(seq([1, 2, 3, 4, 5], 4, group=0), seq([1, 2, 7, 4, 6], 3, group=0))
    assert shared_prefix_units(rows, token_budget=100) == [(2, [0, 1])]
    # Nothing in common: each row is its own unit, unpacked.
    rows = rows_of(seq([1, 2, 3], 2, group=0), seq([4, 2, 3], 2, group=0))
    assert shared_prefix_units(rows, token_budget=100) == [(0, [0]), (0, [1])]


def test_a_group_longer_than_the_budget_splits_into_units_that_each_carry_the_prefix():
    rows = rows_of(*(seq([*range(1, 11), 20 + i, 30 + i], 10, group=0) for i in range(5)))
    # Prefix 10 + 2 per row: a budget of 15 holds the prefix and two remainders.
    units = shared_prefix_units(rows, token_budget=15)
    assert units == [(10, [0, 1]), (10, [2, 3]), (0, [4])]
    batches = packed_micro_batches(rows, token_budget=15)
    assert sorted(i for b in batches for i in _row_numbers(b, rows)) == list(range(5))
    for batch in batches:
        width = batch.input_ids.shape[1]
        assert width * batch.input_ids.shape[0] <= 15 or batch.input_ids.shape[0] == 1


def test_micro_batches_of_unrelated_rows_stay_plain_rows():
    rows = rows_of(seq([1, 2, 3], 2, group=0), seq([4, 5, 6, 7], 2, group=1))
    batches = packed_micro_batches(rows, token_budget=100)
    assert len(batches) == 1 and isinstance(batches[0], Rows)
    with pytest.raises(ValueError, match="token_budget"):
        packed_micro_batches(rows, token_budget=0)


def test_the_packed_layout_restarts_positions_after_the_prefix_and_masks_siblings():
    rows = rows_of(seq([1, 2, 3, 4, 5], 3, group=0), seq([1, 2, 3, 6], 3, group=0))
    (packed,) = packed_micro_batches(rows, token_budget=100)
    assert isinstance(packed, PackedBatch)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    assert packed.segments.tolist() == [[0, 0, 0, 1, 1, 2]]
    assert packed.processed_tokens == 6  # 9 in padded rows
    allowed = (packed.attention_mask(torch.float32)[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],  # the second remainder sees the prefix and itself, not the first
    ]


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory: pytest.TempPathFactory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path_factory.mktemp("packing-model"), vocab_size=128)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, config)
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # a trained-looking adapter, so the LoRA path shapes the logprobs
            torch.nn.init.normal_(param, std=0.2)
    return model.eval()


def _loss_and_grads(model, logprobs: torch.Tensor, rows: Rows):
    loss = -(torch.where(rows.trained_mask, logprobs, 0.0) * rows.advantages[:, None]).sum()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    return loss.detach(), grads


def test_packed_logprobs_and_gradients_equal_the_padded_forward(lora_model):
    rows = mixed_rows()
    output = lora_model(input_ids=rows.input_ids, attention_mask=rows.attention_mask)
    plain, plain_entropy = token_logprobs_and_entropy(output.logits, rows.input_ids)
    plain = torch.where(rows.trained_mask, plain, 0.0)
    plain_loss, plain_grads = _loss_and_grads(lora_model, plain, rows)

    (packed,) = packed_micro_batches(rows, token_budget=1000)
    assert isinstance(packed, PackedBatch)
    assert packed.processed_tokens < int(rows.attention_mask.sum())
    order = [rows.trajectory_ids.index(t) for t in packed.rows.trajectory_ids]
    width = packed.input_ids.shape[1]
    output = lora_model(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask(torch.float32),
        position_ids=packed.position_ids,
        use_cache=False,
        logits_to_keep=width - packed.first_kept,
    )
    new, entropy = packed_logprobs_and_entropy(output.logits, packed)
    trained = packed.rows.trained_mask
    reference = plain[order][:, : trained.shape[1]]
    assert torch.allclose(new[trained], reference[trained], atol=1e-5)
    assert torch.allclose(
        entropy[trained], plain_entropy[order][:, : trained.shape[1]][trained], atol=1e-4
    )
    assert (new[~trained] == 0).all()
    packed_loss, packed_grads = _loss_and_grads(lora_model, new, packed.rows)
    assert torch.allclose(packed_loss, plain_loss, atol=1e-5)
    for a, b in zip(plain_grads, packed_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert any(float(g.abs().sum()) > 0 for g in packed_grads)


def test_packing_only_where_the_forward_takes_the_mask_as_it_is(lora_model):
    assert packing_supported(lora_model)
    config = lora_model.get_base_model().config
    original = config._attn_implementation
    try:
        config._attn_implementation = "flash_attention_2"
        assert not packing_supported(lora_model)
    finally:
        config._attn_implementation = original

    def fake(config_values: dict, forward_module: str = "transformers.models.x"):
        forward = types.FunctionType((lambda self: None).__code__, {})
        forward.__module__ = forward_module
        cls = type("Fake", (), {"forward": forward})
        model = cls()
        model.config = types.SimpleNamespace(_attn_implementation="sdpa", **config_values)
        return model

    assert packing_supported(fake({"layer_types": ["full_attention"] * 2}))
    assert not packing_supported(fake({"layer_types": ["sliding_attention", "full_attention"]}))
    assert not packing_supported(fake({"sliding_window": 4096}))
    assert packing_supported(fake({"sliding_window": 4096, "use_sliding_window": False}))
    assert not packing_supported(fake({}, forward_module="unsloth.models.llama"))


def _row_numbers(batch: PackedBatch | Rows, rows: Rows) -> list[int]:
    inner = batch.rows if isinstance(batch, PackedBatch) else batch
    return [rows.trajectory_ids.index(t) for t in inner.trajectory_ids]
