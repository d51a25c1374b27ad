"""ART's `backend.train` loss options, mapped onto our loss presets and checked by hand.

Each test follows one ART keyword from `train_config_from_art` (client) through
`loss_config_for` (server) into the pure loss of `_grpo`, against the formula in ART 0.5.23's
src/art/loss.py and src/art/preprocessing/pack.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from art_backend.training._grpo import (
    advantages_from_rewards,
    balance_advantages,
    importance_ratio,
    loss_preset,
    policy_loss,
)
from art_backend.training._training_service import loss_config_for
from art_core.errors import UnknownFieldError, UnsupportedOptionError
from art_core.types import train_config_from_art


def loss_config(**art_options):
    """The LossConfig the server runs for these ART keywords."""
    config, _ = train_config_from_art(art_options)
    return loss_config_for(config)


def close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype))


# Row 0 trains tokens 0, 1 (log ratios ln 1.5, ln 1.1); row 1 trains tokens 1, 2 (ln 0.7, ln 0.9).
RATIOS = [[1.5, 1.1, 1.0], [1.0, 0.7, 0.9]]
MASK = torch.tensor([[1, 1, 0], [0, 1, 1]])
TRAINED = MASK.bool()


def logprobs(ratios=RATIOS, old: float = -1.0):
    """old logprobs and new = old + ln(ratio), new requiring grad."""
    ratio = torch.tensor(ratios, dtype=torch.float64)
    old_logprobs = torch.full_like(ratio, old)
    return (old_logprobs + ratio.log()).requires_grad_(), old_logprobs


# --- defaults and epsilons ------------------------------------------------------------------------


def test_the_default_is_arts_cispo_with_epsilon_1_and_epsilon_high_4():
    config, client = train_config_from_art({})
    assert (config.loss, config.learning_rate, config.scale_rewards) == ("cispo", 5e-6, "group")
    assert client == {"save_checkpoint": True, "verbose": False}
    loss = loss_config()
    assert (loss.objective, loss.ratio_level, loss.eps_low, loss.eps_high) == (
        "cispo", "token", 1.0, 4.0,
    )  # fmt: skip


def test_cispo_epsilon_alone_keeps_epsilon_high_at_4_as_art():
    loss = loss_config(epsilon=0.5)
    assert (loss.eps_low, loss.eps_high) == (0.5, 4.0)
    assert (loss_config(epsilon_high=2.0).eps_low, loss_config(epsilon_high=2.0).eps_high) == (
        1.0, 2.0,
    )  # fmt: skip


def test_ppo_clips_at_0_2_and_epsilon_high_follows_epsilon():
    assert (loss_config(loss_fn="ppo").eps_low, loss_config(loss_fn="ppo").eps_high) == (0.2, 0.2)
    loss = loss_config(loss_fn="ppo", epsilon=0.1)
    assert (loss.objective, loss.eps_low, loss.eps_high) == ("ppo_clip", 0.1, 0.1)
    assert loss_config(loss_fn="ppo", epsilon=0.1, epsilon_high=0.3).eps_high == 0.3


def test_ppo_loss_by_hand():
    new, old = logprobs()
    advantages = torch.tensor([1.0, -1.0])
    loss, metrics = policy_loss(new, old, advantages, MASK, loss_config(loss_fn="ppo"))
    # Row 0 (A=+1): -min(1.5, 1.2) = -1.2 (clipped), -1.1. Row 1 (A=-1): -min(-0.7, -0.8) = 0.8
    # (clipped: ratio below 0.8 with A < 0), 0.9. Token mean over 4 tokens.
    close(loss, (-1.2 - 1.1 + 0.8 + 0.9) / 4)
    close(metrics["clip_fraction"], 0.5)
    loss.backward()
    assert new.grad is not None
    close(new.grad[0, 0], 0.0)  # clipped tokens give no gradient
    close(new.grad[0, 1], -1.1 / 4)  # d(-r A)/d logp = -r A


def test_cispo_loss_by_hand_with_arts_clip():
    new, old = logprobs([[6.0, 1.1, 1.0], [1.0, 0.7, 0.9]])
    advantages = torch.tensor([1.0, -1.0])
    loss, metrics = policy_loss(new, old, advantages, MASK, loss_config())
    # The weight is clip(r, 0, 5), detached: 6 -> 5. Loss = -mean(w A logp_new).
    weights = torch.tensor([[5.0, 1.1, 0.0], [0.0, 0.7, 0.9]], dtype=torch.float64)
    signs = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    expected = -(weights * signs * new.detach() * MASK).sum() / 4
    close(loss, float(expected))
    close(metrics["clip_fraction"], 0.25)


def test_unknown_and_unsupported_art_options_are_named_errors():
    with pytest.raises(UnknownFieldError, match="learning_rate"):
        train_config_from_art({"learnig_rate": 1e-4})
    with pytest.raises(UnsupportedOptionError, match="loss_fn"):
        train_config_from_art({"loss_fn": "dro"})
    with pytest.raises(UnsupportedOptionError, match="adam_params"):
        train_config_from_art({"adam_params": {"beta1": 0.8}})
    with pytest.raises(UnsupportedOptionError, match="grad_accumulation_sequences"):
        train_config_from_art({"grad_accumulation_sequences": 4})
    # Values with no effect on the math here are accepted.
    _, client = train_config_from_art(
        {"allow_training_without_logprobs": True, "optimizer_save_interval": 1,
         "logprob_calculation_chunk_size": 256, "save_checkpoint": False, "verbose": True}
    )  # fmt: skip
    assert client == {"save_checkpoint": False, "verbose": True}


# --- importance-sampling levels -------------------------------------------------------------------


def hand_ratios(level: str) -> list[list[float]]:
    """ART's ratio at each level, on the trained tokens of RATIOS (0 where untrained)."""
    s0 = math.exp((math.log(1.5) + math.log(1.1)) / 2)  # geometric mean of row 0's ratios
    s1 = math.exp((math.log(0.7) + math.log(0.9)) / 2)
    token = [[1.5, 1.1], [0.7, 0.9]]
    seq = [[s0, s0], [s1, s1]]
    if level == "token":
        values = token
    elif level == "sequence":
        values = seq
    elif level == "average":
        values = [
            [(t + s) / 2 for t, s in zip(tr, sr, strict=True)]
            for tr, sr in zip(token, seq, strict=True)
        ]
    else:
        values = [
            [math.sqrt(t) * math.sqrt(s) for t, s in zip(tr, sr, strict=True)]
            for tr, sr in zip(token, seq, strict=True)
        ]
    return [[values[0][0], values[0][1], 1.0], [1.0, values[1][0], values[1][1]]]


@pytest.mark.parametrize("level", ["token", "sequence", "average", "geometric_average"])
def test_each_importance_sampling_level_matches_the_hand_computation(level: str):
    new, old = logprobs()
    log_ratio = torch.where(TRAINED, new.detach() - old, 0.0)
    ratio = importance_ratio(log_ratio, TRAINED, level)  # type: ignore[arg-type]
    expected = torch.tensor(hand_ratios(level), dtype=torch.float64)
    close(torch.where(TRAINED, ratio, 1.0), expected)
    # Through ART's keyword, the loss uses that ratio: ratio_mean is its mean on trained tokens.
    config = loss_config(loss_fn="ppo", importance_sampling_level=level, epsilon=10.0)
    assert config.ratio_level == level
    _, metrics = policy_loss(new, old, torch.tensor([1.0, -1.0]), MASK, config)
    close(metrics["ratio_mean"], float(expected[TRAINED].mean()))


def test_sequence_level_gradient_flows_through_every_token_of_the_row():
    new, old = logprobs()
    config = loss_config(loss_fn="ppo", importance_sampling_level="sequence", epsilon=10.0)
    loss, _ = policy_loss(new, old, torch.tensor([1.0, 0.0]), MASK, config)
    loss.backward()
    assert new.grad is not None
    # Row 0's two tokens each add -s0 A / 4, and d s0 / d logp_t = s0 / 2: each gets -s0 / 4.
    s0 = math.exp((math.log(1.5) + math.log(1.1)) / 2)
    close(new.grad[0, :2], [-s0 / 4, -s0 / 4])


# --- advantages -----------------------------------------------------------------------------------


def test_scale_rewards_false_only_centres_as_normalize_advantages_false():
    assert loss_config(scale_rewards=False).scale_rewards == "none"
    assert loss_config(normalize_advantages=False).scale_rewards == "none"
    assert loss_config(scale_rewards=True).scale_rewards == "group"
    advantages, _ = advantages_from_rewards(
        torch.tensor([0.0, 1.0, 5.0]), torch.zeros(3), scale_rewards="none"
    )
    close(advantages, [-2.0, -1.0, 3.0])


def test_advantage_balance_shrinks_one_sign_by_hand():
    advantages = torch.tensor([-2.0, 1.0, 3.0])
    assert loss_config(advantage_balance=0.5).advantage_balance == 0.5
    close(balance_advantages(advantages, 0.5), [-1.0, 1.0, 3.0])  # negatives x (1 - 0.5)
    close(balance_advantages(advantages, -0.25), [-2.0, 0.75, 2.25])  # positives x (1 - 0.25)
    close(balance_advantages(advantages, 1.0), [0.0, 1.0, 3.0])  # only positives train
    with pytest.raises(ValidationError, match="advantage_balance"):  # ART's range, [-1, 1]
        train_config_from_art({"advantage_balance": 1.5})


def test_kl_penalty_coef_shapes_the_advantages_by_hand():
    # Ratio 1 everywhere (new == old), PPO: d loss / d logp_t = -A_t / tokens, so the gradient
    # reads the shaped advantage A_t = A + coef * (mean KL - KL_t), KL_t = logp_new_t - logp_ref_t.
    new, old = logprobs([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    ref = old.clone()
    ref[0, 0] -= 0.4  # token (0, 0) diverges by 0.4 from the reference; the others by 0
    config = loss_config(loss_fn="ppo", kl_penalty_coef=0.5)
    assert (config.kl_penalty_coef, config.kl_penalty_source) == (0.5, "current_learner")
    loss, metrics = policy_loss(new, old, torch.tensor([1.0, -1.0]), MASK, config, ref_logprobs=ref)
    close(metrics["kl_policy_ref"], 0.1)  # mean of 0.4, 0, 0, 0
    loss.backward()
    assert new.grad is not None
    shaped = [[1 + 0.5 * (0.1 - 0.4), 1 + 0.5 * 0.1], [-1 + 0.5 * 0.1, -1 + 0.5 * 0.1]]
    close(new.grad[0, :2], [-a / 4 for a in shaped[0]])
    close(new.grad[1, 1:], [-a / 4 for a in shaped[1]])


def test_kl_penalty_without_a_reference_leaves_the_loss_alone():
    new, old = logprobs()
    plain, _ = policy_loss(new, old, torch.tensor([1.0, -1.0]), MASK, loss_config())
    shaped, metrics = policy_loss(
        new, old, torch.tensor([1.0, -1.0]), MASK, loss_config(kl_penalty_coef=1.0)
    )
    close(shaped, float(plain.detach()))
    assert "kl_policy_ref" not in metrics


# --- the other ART loss options -------------------------------------------------------------------


def test_max_negative_advantage_is_weight_caps_the_ratio_before_the_clip():
    new, old = logprobs([[3.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    config = loss_config(max_negative_advantage_importance_sampling_weight=2.0)
    loss, metrics = policy_loss(new, old, torch.tensor([1.0, 1.0]), MASK, config)
    # CISPO weight min(3, 2) = 2 on token (0, 0), 1 elsewhere; ratio_mean reads the raw ratio.
    # Loss = -mean(w A logp_new), logp_new = ln 3 - 1 on token (0, 0) and -1 elsewhere.
    close(loss, -(2.0 * (math.log(3) - 1) + 3 * -1.0) / 4)
    close(metrics["ratio_mean"], (3 + 1 + 1 + 1) / 4)


def test_mask_prob_ratio_zeroes_ratios_outside_the_clip_range():
    new, old = logprobs([[1.5, 1.1, 1.0], [1.0, 0.7, 0.9]])
    config = loss_config(loss_fn="ppo", mask_prob_ratio=True)
    loss, _ = policy_loss(new, old, torch.tensor([1.0, -1.0]), MASK, config)
    # 1.5 and 0.7 fall outside (0.8, 1.2) and become 0, then PPO clips 0 to 0.8:
    # row 0 (A=+1): -min(0, 0.8) = 0, then -1.1; row 1 (A=-1): -min(0, -0.8) = 0.8, then 0.9.
    close(loss, (0.0 - 1.1 + 0.8 + 0.9) / 4)


def test_kimi_k2_tau_subtracts_the_detached_log_ratio_from_the_advantage():
    new, old = logprobs([[2.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    config = loss_config(loss_fn="ppo", kimi_k2_tau=0.5, epsilon=10.0)
    loss, _ = policy_loss(new, old, torch.tensor([1.0, 1.0]), MASK, config)
    # Token (0, 0): A = 1 - 0.5 ln 2, ratio 2; the others A = 1, ratio 1.
    close(loss, -(2 * (1 - 0.5 * math.log(2)) + 3 * 1.0) / 4)


def test_precalculate_logprobs_makes_the_step_on_policy_and_weighs_by_the_truncated_sampler_ratio():
    new, sampler = logprobs([[2.0, 0.5, 1.0], [1.0, 1.0, 1.0]])
    # old = sampler logprobs; the trainer's own are `new`, so exp(old_trainer - sampler) = ratio.
    config = loss_config(
        loss_fn="ppo", precalculate_logprobs=True, truncated_importance_sampling=1.5
    )
    loss, metrics = policy_loss(new, sampler, torch.tensor([1.0, 1.0]), MASK, config)
    close(metrics["ratio_mean"], 1.0)  # the PPO ratio is 1: old logprobs are the trainer's
    close(loss, -(1.5 + 0.5 + 1.0 + 1.0) / 4)  # weights min(2, 1.5), 0.5, 1, 1
    assert loss_preset("cispo").precalculate_logprobs is False
