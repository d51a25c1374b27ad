"""The GRPO math: advantages, the four loss presets, and TRL's dapo loss as the reference."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from art_backend.training._grpo import (
    LOSS_PRESETS,
    LossConfig,
    advantages_from_rewards,
    loss_denominator,
    loss_preset,
    policy_loss,
)

EPS = 1e-4


def close(actual: torch.Tensor, expected: float | list) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


def logprobs_from_ratios(ratios: list[list[float]], old: float = -1.0):
    """old logprobs and new = old + ln(ratio): the token ratios are exactly `ratios`."""
    ratio = torch.tensor(ratios, dtype=torch.float64)
    old_logprobs = torch.full_like(ratio, old)
    new_logprobs = (old_logprobs + ratio.log()).requires_grad_()
    return new_logprobs, old_logprobs


# --- advantages ---------------------------------------------------------------------------------

# Group 7 has rewards 0, 2, 4 (mean 2, sample std 2); group 3 has 5, 5 (zero variance).
REWARDS = torch.tensor([0.0, 5.0, 2.0, 5.0, 4.0])
GROUP_IDS = torch.tensor([7, 3, 7, 3, 7])


def test_group_scaling_divides_by_the_groups_sample_std_and_drops_zero_variance_groups():
    advantages, trainable = advantages_from_rewards(REWARDS, GROUP_IDS)
    close(advantages, [-2 / (2 + EPS), 0.0, 0.0, 0.0, 2 / (2 + EPS)])
    assert trainable.tolist() == [True, False, True, False, True]


def test_std_is_the_sample_std_as_in_trl():
    # [1, 3]: population std 1, sample std sqrt(2) (Bessel's correction, TRL's nanstd).
    advantages, _ = advantages_from_rewards(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    close(advantages, [-1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)])


def test_batch_scaling_centres_on_the_group_and_divides_by_the_std_of_the_whole_step():
    # All five rewards: mean 3.2, squared deviations sum to 18.8, sample variance 18.8 / 4.
    advantages, trainable = advantages_from_rewards(REWARDS, GROUP_IDS, scale_rewards="batch")
    std = math.sqrt(18.8 / 4)
    close(advantages, [-2 / (std + EPS), 0.0, 0.0, 0.0, 2 / (std + EPS)])
    assert trainable.tolist() == [True, False, True, False, True]


def test_no_scaling_only_centres():
    advantages, trainable = advantages_from_rewards(REWARDS, GROUP_IDS, scale_rewards="none")
    close(advantages, [-2.0, 0.0, 0.0, 0.0, 2.0])
    assert trainable.tolist() == [True, False, True, False, True]


def test_equal_rewards_are_zero_variance_despite_float_noise_in_the_mean():
    advantages, trainable = advantages_from_rewards(torch.tensor([0.1, 0.1, 0.1]), torch.zeros(3))
    assert trainable.tolist() == [False, False, False]
    close(advantages, [0.0, 0.0, 0.0])


def test_a_group_of_one_is_not_trainable_and_has_no_nan():
    advantages, trainable = advantages_from_rewards(
        torch.tensor([1.0, 2.0, 7.0]), torch.tensor([0, 0, 1])
    )
    assert trainable.tolist() == [True, True, False]
    assert advantages[2] == 0 and not advantages.isnan().any()


def test_integer_rewards_and_unknown_scaling():
    advantages, _ = advantages_from_rewards(
        torch.tensor([0, 1]), torch.tensor([0, 0]), scale_rewards="none"
    )
    close(advantages, [-0.5, 0.5])
    with pytest.raises(ValueError, match="scale_rewards"):
        advantages_from_rewards(REWARDS, GROUP_IDS, scale_rewards="global")  # type: ignore[arg-type]


# --- presets ------------------------------------------------------------------------------------


def test_presets_and_their_conventions():
    assert sorted(LOSS_PRESETS) == ["cispo", "dr_grpo", "grpo", "gspo", "ppo"]
    grpo = loss_preset("grpo")
    assert (grpo.eps_low, grpo.eps_high, grpo.aggregation) == (0.2, 0.28, "token_mean")
    assert loss_preset("dr_grpo").scale_rewards == "none"  # Dr. GRPO: advantages are not std-scaled
    assert loss_preset("gspo").ratio_level == "sequence"
    assert loss_preset("dr_grpo", max_completion_length=64).max_completion_length == 64


def test_unknown_preset_raises_and_lists_the_presets():
    with pytest.raises(ValueError, match="grpo, dr_grpo, gspo, cispo, ppo"):
        loss_preset("reinforce")


def test_constant_aggregation_needs_max_completion_length():
    with pytest.raises(ValueError, match="max_completion_length"):
        loss_preset("dr_grpo", max_completion_length=None)


# --- the loss, by hand ---------------------------------------------------------------------------

# Row 0 (A = +1) trains tokens 0, 1 with ratios 1.5, 1.1; row 1 (A = -1) trains tokens 1, 2 with
# ratios 0.7, 0.9. Row 1 token 0 is context; row 0 token 2 is padding.
RATIOS = [[1.5, 1.1, 1.0], [1.0, 0.7, 0.9]]
MASK = torch.tensor([[1, 1, 0], [0, 1, 1]])
ADVANTAGES = torch.tensor([1.0, -1.0])


def test_grpo_clips_per_token_and_averages_over_all_trained_tokens():
    new, old = logprobs_from_ratios(RATIOS)
    loss, metrics = policy_loss(new, old, ADVANTAGES, MASK, loss_preset("grpo"))
    # Clip band [0.8, 1.28]. Row 0: -min(1.5, 1.28) = -1.28, -1.1. Row 1: -min(-0.7, -0.8) = 0.8, 0.9.
    close(loss, (-1.28 - 1.1 + 0.8 + 0.9) / 4)
    close(metrics["clip_fraction"], 2 / 4)  # 1.5 above 1.28 with A > 0; 0.7 below 0.8 with A < 0
    close(metrics["ratio_mean"], (1.5 + 1.1 + 0.7 + 0.9) / 4)
    assert "kl" not in metrics

    loss.backward()
    # d loss / d logp_new = -r A / 4 on unclipped tokens, 0 on clipped and untrained ones.
    close(new.grad, [[0.0, -1.1 / 4, 0.0], [0.0, 0.0, 0.9 / 4]])


def test_dr_grpo_divides_by_max_completion_length_times_rows():
    new, old = logprobs_from_ratios(RATIOS)
    config = loss_preset("dr_grpo", max_completion_length=3)
    loss, metrics = policy_loss(new, old, ADVANTAGES, MASK, config)
    # Clip band [0.8, 1.2]: -1.2, -1.1, 0.8, 0.9 over 3 tokens x 2 rows.
    close(loss, (-1.2 - 1.1 + 0.8 + 0.9) / (3 * 2))
    close(metrics["clip_fraction"], 2 / 4)


def test_gspo_clips_one_ratio_per_sequence_and_averages_over_sequences():
    # Row 0: s = sqrt(1.5 * 1.1) = 1.28 > 1 + 4e-4, clipped. Row 1: s = (0.8 * 1.25 * 1.0)^(1/3) = 1.
    new, old = logprobs_from_ratios([[1.5, 1.1, 1.0], [0.8, 1.25, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, metrics = policy_loss(new, old, ADVANTAGES, mask, loss_preset("gspo"))
    close(
        loss, (-(1 + 4e-4) * 1 + -(1.0 * -1)) / 2
    )  # each sequence weighs 1/2, whatever its length
    close(metrics["clip_fraction"], 2 / 5)  # the two tokens of row 0
    close(metrics["ratio_mean"], (2 * math.sqrt(1.65) + 3 * 1.0) / 5)


def test_gspo_sequence_ratio_is_the_geometric_mean_of_the_token_ratios():
    new, old = logprobs_from_ratios([[2.0, 0.5, 8.0, 100.0]])  # the padding ratio 100 is ignored
    mask = torch.tensor([[1, 1, 1, 0]])
    unclipped = loss_preset("gspo", eps_low=10.0, eps_high=10.0)
    loss, metrics = policy_loss(new, old, torch.tensor([1.0]), mask, unclipped)
    geometric_mean = (2.0 * 0.5 * 8.0) ** (1 / 3)  # = 2
    close(metrics["ratio_mean"], geometric_mean)
    close(loss, -geometric_mean)


def test_cispo_clips_the_detached_weight_and_keeps_every_tokens_gradient():
    new, old = logprobs_from_ratios([[6.0, 1.1, 1.0], [1.0, 0.7, 0.9]], old=-3.0)
    loss, metrics = policy_loss(new, old, ADVANTAGES, MASK, loss_preset("cispo"))
    # -sg(min(r, 5)) A logp_new, logp_new = -3 + ln r; mean over the 4 trained tokens.
    expected = (
        -5.0 * 1 * (-3 + math.log(6.0))
        - 1.1 * 1 * (-3 + math.log(1.1))
        - 0.7 * -1 * (-3 + math.log(0.7))
        - 0.9 * -1 * (-3 + math.log(0.9))
    ) / 4
    close(loss, expected)
    close(metrics["clip_fraction"], 1 / 4)  # only 6.0 exceeds the cap of 5

    loss.backward()
    # Gradient -sg(w) A / 4: the clipped token still learns, with weight 5.
    close(new.grad, [[-5.0 / 4, -1.1 / 4, 0.0], [0.0, 0.7 / 4, 0.9 / 4]])


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "gspo"])
def test_on_policy_loss_is_minus_the_advantage_weighted_mean(preset):
    new, old = logprobs_from_ratios([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    advantages = torch.tensor([2.0, -0.5])
    config = loss_preset(preset, max_completion_length=4)
    loss, metrics = policy_loss(new, old, advantages, mask, config)
    expected = {
        "grpo": -(2.0 * 3 - 0.5 * 1) / 4,  # per token
        "dr_grpo": -(2.0 * 3 - 0.5 * 1) / (4 * 2),  # per token, constant divisor
        "gspo": -(2.0 - 0.5) / 2,  # per sequence
    }[preset]
    close(loss, expected)
    close(metrics["clip_fraction"], 0.0)
    close(metrics["ratio_mean"], 1.0)


# --- KL, gradients, masking ----------------------------------------------------------------------


def test_kl_is_zero_when_ref_equals_new_and_positive_otherwise():
    new, old = logprobs_from_ratios(RATIOS)
    config = loss_preset("grpo")
    base, _ = policy_loss(new, old, ADVANTAGES, MASK, config)

    same, metrics = policy_loss(
        new, old, ADVANTAGES, MASK, config, ref_logprobs=new.detach(), beta=0.1
    )
    close(metrics["kl"], 0.0)
    close(same, base.item())

    ref = new.detach() + torch.tensor([[0.5, -0.5, 0.0], [0.0, 0.2, 0.0]], dtype=torch.float64)
    shifted, metrics = policy_loss(new, old, ADVANTAGES, MASK, config, ref_logprobs=ref, beta=0.1)
    # k3(d) = e^d - d - 1 with d = ref - new, over trained tokens; 0 for the 4th (d = 0).
    k3 = [math.exp(d) - d - 1 for d in (0.5, -0.5, 0.2, 0.0)]
    close(metrics["kl"], sum(k3) / 4)
    assert metrics["kl"] > 0
    close(shifted, base.item() + 0.1 * sum(k3) / 4)


@pytest.mark.parametrize("preset", sorted(LOSS_PRESETS))
def test_gradients_reach_new_logprobs_only(preset):
    new, old = logprobs_from_ratios(RATIOS)
    old.requires_grad_()
    ref = (new.detach() + 0.3).requires_grad_()
    advantages = ADVANTAGES.clone().requires_grad_()
    loss, metrics = policy_loss(
        new, old, advantages, MASK, loss_preset(preset), ref_logprobs=ref, beta=0.1
    )
    loss.backward()
    assert new.grad is not None and new.grad.abs().sum() > 0
    assert old.grad is None and ref.grad is None and advantages.grad is None
    assert all(not value.requires_grad for value in metrics.values())


@pytest.mark.parametrize("preset", sorted(LOSS_PRESETS))
def test_context_positions_holding_nan_or_inf_do_not_leak_into_the_loss(preset):
    new, old = logprobs_from_ratios(RATIOS)
    garbage_old, garbage_ref = old.clone(), new.detach().clone()  # ref == new: the KL adds 0
    for garbage in (garbage_old, garbage_ref):
        garbage[1, 0], garbage[0, 2] = float("nan"), float("-inf")  # both untrained positions
    clean, _ = policy_loss(new, old, ADVANTAGES, MASK, loss_preset(preset))
    dirty, _ = policy_loss(
        new, garbage_old, ADVANTAGES, MASK, loss_preset(preset), ref_logprobs=garbage_ref, beta=0.1
    )
    close(dirty, clean.item())
    dirty.backward()
    assert new.grad is not None and new.grad.isfinite().all()


@pytest.mark.parametrize("preset", sorted(LOSS_PRESETS))
def test_a_row_of_zeros_counts_nowhere(preset):
    # How the caller drops a truncated completion: its mask row is all zeros.
    new, old = logprobs_from_ratios(RATIOS)
    config = loss_preset(preset)
    with_row, _ = policy_loss(new, old, ADVANTAGES, MASK, config)
    zero_row = torch.zeros(1, 3, dtype=MASK.dtype)
    padded_new = torch.cat([new, new[:1]])
    padded_old = torch.cat([old, old[:1]])
    padded, _ = policy_loss(
        padded_new, padded_old, torch.tensor([1.0, -1.0, 5.0]), torch.cat([MASK, zero_row]), config
    )
    close(padded, with_row.item())


@pytest.mark.parametrize("preset", sorted(LOSS_PRESETS))
def test_micro_batches_with_the_steps_denominator_add_up_to_the_whole_batch(preset):
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=generator, dtype=torch.float64) - 0.5
    new = old + 0.3 * torch.randn(4, 5, generator=generator, dtype=torch.float64)
    mask = (torch.rand(4, 5, generator=generator) < 0.7).long()
    advantages = torch.tensor([1.0, -0.5, 0.3, -2.0])
    config = loss_preset(preset, max_completion_length=5)
    whole, _ = policy_loss(new, old, advantages, mask, config)
    step = loss_denominator(mask[:2], config) + loss_denominator(mask[2:], config)
    first, _ = policy_loss(new[:2], old[:2], advantages[:2], mask[:2], config, denominator=step)
    second, _ = policy_loss(new[2:], old[2:], advantages[2:], mask[2:], config, denominator=step)
    close(first + second, whole.item())


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "gspo", "cispo"])
def test_untrained_counts_give_trls_loss_with_the_all_equal_rows_in_the_batch(preset):
    """zero_variance_in_denominator: the rows of an all-equal group (advantage 0) left out, their
    tokens and rows counted, give the loss of the batch that holds them, as TRL computes it."""
    generator = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 5, generator=generator, dtype=torch.float64) - 0.5
    new = old + 0.3 * torch.randn(4, 5, generator=generator, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.0])  # rows 2 and 3: an all-equal group
    config = loss_preset(preset, max_completion_length=5)
    whole, _ = policy_loss(new, old, advantages, mask, config)
    counted = dataclasses.replace(config, untrained_tokens=int(mask[2:].sum()), untrained_rows=2)
    part, _ = policy_loss(new[:2], old[:2], advantages[:2], mask[:2], counted)
    close(part, whole.item())
    plain, _ = policy_loss(new[:2], old[:2], advantages[:2], mask[:2], config)
    assert abs(plain.item()) > abs(part.item())  # without the counts the step weighs more


def test_no_trained_tokens_gives_a_zero_loss():
    new, old = logprobs_from_ratios(RATIOS)
    loss, metrics = policy_loss(new, old, ADVANTAGES, torch.zeros_like(MASK), loss_preset("grpo"))
    close(loss, 0.0)
    close(metrics["clip_fraction"], 0.0)


# --- against TRL -------------------------------------------------------------------------------


def trl_dapo_reference(rewards, num_generations, per_token_logps, old_per_token_logps, ref_per_token_logps, mask, beta, epsilon_low, epsilon_high):  # fmt: skip
    """TRL's advantages and loss_type="dapo" loss, transcribed literally from huggingface/trl at
    commit f2cd57710ae345ea6428ae95363267fcf38a3dc8: trl/trainer/utils.py `nanstd`, and
    trl/trainer/grpo_trainer.py `_generate_and_score_completions` (sum_then_normalize,
    scale_rewards="group") and `_compute_loss` (importance_sampling_level="token", one process,
    no vLLM correction, no entropy mask, delta=None)."""

    def nanstd(tensor, dim=None, keepdim=False):
        mean = torch.nanmean(tensor, dim=dim, keepdim=True)
        variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
        count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
        correction = count / (count - 1)
        correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
        variance *= correction  # Bessel's correction
        std = torch.sqrt(variance)
        if keepdim:
            return std
        if dim is None:
            return std.squeeze()
        return std.squeeze(dim)  # TRL also handles a tuple of dims; one int is enough here

    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
    std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped_rewards
    advantages = advantages / (std_rewards + 1e-4)

    num_items_in_batch = mask.sum()
    advantages_2d = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    log_importance_weights = log_ratio
    coef_1 = torch.exp(log_importance_weights)
    per_token_kl = (
        torch.exp(ref_per_token_logps - per_token_logps)
        - (ref_per_token_logps - per_token_logps)
        - 1
    )
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages_2d
    per_token_loss2 = coef_2 * advantages_2d
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    per_token_loss = per_token_loss + beta * per_token_kl
    normalizer = num_items_in_batch.clamp(min=1.0) / 1  # accelerator.num_processes
    loss = (per_token_loss * mask).sum() / normalizer

    is_low_clipped = (coef_1 < 1 - epsilon_low) & (advantages_2d < 0)
    is_high_clipped = (coef_1 > 1 + epsilon_high) & (advantages_2d > 0)
    is_region_clipped = is_low_clipped | is_high_clipped
    clip_ratio = (is_region_clipped.float() * mask).sum() / mask.sum()
    kl = (per_token_kl * mask).sum() / mask.sum()
    return advantages, loss, clip_ratio, kl


def test_grpo_preset_matches_trl_dapo_loss_on_random_tensors():
    generator = torch.Generator().manual_seed(1234)
    rows, tokens, num_generations, beta = 8, 6, 4, 0.04
    rewards = torch.rand(rows, generator=generator, dtype=torch.float64)
    old = -2 * torch.rand(rows, tokens, generator=generator, dtype=torch.float64)
    new_values = old + 0.3 * torch.randn(rows, tokens, generator=generator, dtype=torch.float64)
    ref = old + 0.1 * torch.randn(rows, tokens, generator=generator, dtype=torch.float64)
    mask = (torch.rand(rows, tokens, generator=generator) < 0.8).to(torch.float64)

    ours_new = new_values.clone().requires_grad_()
    trl_new = new_values.clone().requires_grad_()
    group_ids = torch.arange(rows) // num_generations
    advantages, trainable = advantages_from_rewards(rewards, group_ids)
    loss, metrics = policy_loss(
        ours_new, old, advantages, mask, loss_preset("grpo"), ref_logprobs=ref, beta=beta
    )
    trl_advantages, trl_loss, trl_clip_ratio, trl_kl = trl_dapo_reference(
        rewards, num_generations, trl_new, old, ref, mask, beta, epsilon_low=0.2, epsilon_high=0.28
    )

    assert trainable.all()
    torch.testing.assert_close(advantages, trl_advantages)
    torch.testing.assert_close(loss, trl_loss)
    torch.testing.assert_close(metrics["clip_fraction"], trl_clip_ratio.to(torch.float64))
    torch.testing.assert_close(metrics["kl"], trl_kl.detach())
    assert 0 < metrics["clip_fraction"] < 1  # the case exercises clipping

    loss.backward()
    trl_loss.backward()
    torch.testing.assert_close(ours_new.grad, trl_new.grad)


def test_loss_config_rejects_negative_epsilons():
    with pytest.raises(ValueError, match="eps_low"):
        LossConfig(
            name="x",
            ratio_level="token",
            objective="ppo_clip",
            aggregation="token_mean",
            eps_low=-0.1,
            eps_high=0.2,
        )
