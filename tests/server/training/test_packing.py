"""Shared-prefix packing: the packed forward gives the padded forward's logprobs and gradients."""

from __future__ import annotations

import types

import pytest
import torch

from art_backend.training._logprobs import packed_logprobs_and_entropy, token_logprobs_and_entropy
from art_backend.training._packing import (
    PackedBatch,
    packed_micro_batches,
    packing_supported,
    shared_prefix_units,
)
from art_backend.training._rows import Rows, Sequence, pack_rows
from tests.support.tiny_model import build_tiny_model
from tests.support.trainers import twin_trainers


def seq(
    tokens: list[int],
    trained_from: int,
    *,
    group: int,
    advantage: float = 1.0,
    context: tuple[int, int] | None = None,
) -> Sequence:
    """A sequence whose tokens from `trained_from` on were sampled, but for a `context` span
    (a tool result between two sampled turns)."""
    mask = torch.zeros(len(tokens), dtype=torch.bool)
    mask[trained_from:] = True
    if context is not None:
        mask[context[0] : context[1]] = False
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
    prompts differ (a tool result) and whose first turns differ at token 9; group 3 alone;
    group 4: rows that differ before their first sampled token (untrained context opens each
    remainder) and hold a tool result between two sampled turns."""
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    return rows_of(
        seq([*prompt, 30, 31, 32], 12, group=1, advantage=1.0),
        seq([*prompt, 33, 34], 12, group=1, advantage=-1.0),
        seq([*prompt, 30, 35, 36, 37, 38], 12, group=1, advantage=0.5),
        seq([5, 6, 7, 8, 9, 20, 21, 22, 23, 40, 41, 42, 43, 44], 9, group=2, advantage=0.7),
        seq([5, 6, 7, 8, 9, 20, 21, 22, 23, 45, 46, 47], 9, group=2, advantage=-0.7),
        seq([5, 6, 7, 50, 51], 3, group=3, advantage=0.2),
        seq(
            [5, 6, 7, 8, 70, 71, 72, 80, 81, 90, 91, 82, 83],
            7,
            group=4,
            advantage=0.9,
            context=(9, 11),
        ),
        seq([5, 6, 7, 8, 73, 74, 75, 84, 85, 86], 7, group=4, advantage=-0.9),
    )


def test_a_group_shares_its_prompt_up_to_the_first_trained_token():
    rows = mixed_rows()
    units = shared_prefix_units(rows, token_budget=1000)
    assert units == [(12, [0, 1, 2]), (9, [3, 4]), (0, [5]), (4, [6, 7])]


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


def _forward(model, batch: PackedBatch | Rows) -> tuple[torch.Tensor, torch.Tensor, Rows]:
    """Logprobs and entropy of a micro-batch's rows, aligned with them, and the rows."""
    if isinstance(batch, Rows):
        output = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        new, entropy = token_logprobs_and_entropy(output.logits, batch.input_ids)
        return torch.where(batch.trained_mask, new, 0.0), entropy, batch
    width = batch.input_ids.shape[1]
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask(torch.float32),
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=width - batch.first_kept,
    )
    new, entropy = packed_logprobs_and_entropy(output.logits, batch)
    return new, entropy, batch.rows


@pytest.mark.parametrize("budget", [1000, 20])  # 20: group 1 splits into a packed pair and a row
def test_packed_logprobs_and_gradients_equal_the_padded_forward(lora_model, budget: int):
    rows = mixed_rows()
    plain, plain_entropy, _ = _forward(lora_model, rows)
    plain_loss, plain_grads = _loss_and_grads(lora_model, plain, rows)

    batches = packed_micro_batches(rows, token_budget=budget)
    assert any(isinstance(batch, PackedBatch) for batch in batches)
    assert sorted(t for b in batches for t in _trajectories(b)) == sorted(rows.trajectory_ids)
    total = torch.zeros(())
    for batch in batches:
        new, entropy, batch_rows = _forward(lora_model, batch)
        trained = batch_rows.trained_mask
        order = [rows.trajectory_ids.index(t) for t in batch_rows.trajectory_ids]
        width = trained.shape[1]
        assert torch.allclose(new[trained], plain[order][:, :width][trained], atol=1e-5)
        assert torch.allclose(entropy[trained], plain_entropy[order][:, :width][trained], atol=1e-4)
        assert (new[~trained] == 0).all()
        total = total + (-(new * batch_rows.advantages[:, None]).sum())
    params = [p for p in lora_model.parameters() if p.requires_grad]
    packed_grads = torch.autograd.grad(total, params)
    assert torch.allclose(total.detach(), plain_loss, atol=1e-5)
    for a, b in zip(plain_grads, packed_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert any(float(g.abs().sum()) > 0 for g in packed_grads)


def test_logits_of_another_width_are_refused():
    rows = rows_of(seq([1, 2, 3, 4, 5], 3, group=0), seq([1, 2, 3, 6], 3, group=0))
    (packed,) = packed_micro_batches(rows, token_budget=100)
    assert isinstance(packed, PackedBatch)
    with pytest.raises(ValueError, match="logits cover"):
        packed_logprobs_and_entropy(torch.zeros(1, 6, 8), packed)  # all 6 columns, not 4


def test_packing_only_where_the_forward_takes_the_mask_as_it_is(lora_model):
    assert packing_supported(lora_model)
    config = lora_model.get_base_model().config
    original = config._attn_implementation
    try:
        config._attn_implementation = "flash_attention_2"
        assert not packing_supported(lora_model)
    finally:
        config._attn_implementation = original

    def fake(config_values: dict, module: str = "transformers.models.x", attention: str = ""):
        def forward(self):  # a stand-in; only its module is read
            return None

        forward.__module__ = module
        cls = type("Fake", (), {"forward": forward})
        attention_cls = type("FakeAttention", (), {"forward": forward})
        if attention:
            patched = types.FunctionType(forward.__code__, {})
            patched.__module__ = attention
            attention_cls = type("FakeAttention", (), {"forward": patched})
        model = cls()
        model.modules = lambda: iter([model, attention_cls()])
        values = {"_attn_implementation": "sdpa", "rope_theta": 10000.0, **config_values}
        model.config = types.SimpleNamespace(**values)
        return model

    assert packing_supported(fake({"layer_types": ["full_attention"] * 2}))
    # Sliding windows take a windowed mask; chunks and recurrent state do not pack.
    assert packing_supported(fake({"layer_types": ["sliding_attention", "full_attention"]}))
    assert packing_supported(fake({"sliding_window": 4096}))
    assert not packing_supported(fake({"layer_types": ["linear_attention", "full_attention"]}))
    assert not packing_supported(fake({"attention_chunk_size": 8192}))
    assert not packing_supported(fake({}, module="unsloth.models.llama"))
    assert not packing_supported(fake({}, attention="unsloth.models.llama"))
    # Positions must reach the attention: ALiBi (bias from key indices) and no-RoPE models are out.
    assert not packing_supported(fake({"alibi": True}))
    assert not packing_supported(fake({"rope_theta": None}))


def _row_numbers(batch: PackedBatch | Rows, rows: Rows) -> list[int]:
    return [rows.trajectory_ids.index(t) for t in _trajectories(batch)]


def _trajectories(batch: PackedBatch | Rows) -> list[str]:
    return (batch.rows if isinstance(batch, PackedBatch) else batch).trajectory_ids


def test_a_grpo_step_packed_equals_the_padded_step(tmp_path_factory: pytest.TempPathFactory):
    """Two trainers from the same seed, one packing and one not: the same loss, KL, gradient
    norm and updated adapter, step after step (the second step with a KL term to the base)."""
    from art_backend.testing import OptimizerSettings, loss_preset

    packed, padded = twin_trainers(tmp_path_factory.mktemp("packing-trainer"), seed=3)
    rows = mixed_rows()
    settings = OptimizerSettings(learning_rate=5e-3, micro_batch_tokens=20)
    initial = [param.detach().clone() for param in packed.params]
    for beta in (0.0, 0.04):
        metrics = [
            trainer.grpo_step(rows, loss_preset("grpo"), settings, beta=beta)
            for trainer in (packed, padded)
        ]
        assert metrics[0]["shared_prefix_tokens"] > 0 == metrics[1]["shared_prefix_tokens"]
        for key in ("loss", "grad_norm", "entropy", "ratio_mean", *(["kl"] if beta else [])):
            assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-4, abs=1e-6), key
        for a, b in zip(packed.params, padded.params, strict=True):
            assert torch.allclose(a, b, atol=1e-6)
    assert not all(torch.equal(a, b) for a, b in zip(initial, packed.params, strict=True))
