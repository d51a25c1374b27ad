"""The GRPO math: group-relative advantages and the clipped policy loss, as pure tensor functions.

Notation: a step holds rows (one trajectory each) of tokens. `mask` is 1 on trained (sampled)
tokens, 0 on context and padding. logp_new is the policy being trained, logp_old the sampler's
logprobs recorded at generation time, A_i the advantage of row i.

Papers: GRPO, DeepSeekMath (arXiv 2402.03300); DAPO (2503.14476); Dr. GRPO, "Understanding
R1-Zero-like Training" (2503.20783); GSPO, Qwen 2025 (2507.18071); CISPO, MiniMax-M1 (2506.13585).
Reference implementation read: huggingface/trl@f2cd57710ae3, trl/trainer/grpo_trainer.py.

Truncated rows (TRL's `mask_truncated_completions`): the caller passes their mask as a row of
zeros. A row of zeros counts nowhere: not in a numerator, not in a denominator, in any preset.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch

ScaleRewards = Literal["group", "batch", "none"]


def advantages_from_rewards(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale_rewards: ScaleRewards = "group",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A_i = (r_i - mean of i's group) / (std + eps); returns (advantages, trainable_mask).

    A group whose rewards are all equal teaches nothing: it is not trainable and its advantages are 0.
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    _, group = torch.unique(group_ids, return_inverse=True)  # group index 0..G-1 of every row
    num_groups = int(group.max()) + 1 if group.numel() else 0

    def per_group_sum(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(num_groups).index_add_(0, group, values)

    # The sums run over rewards / scale (scale = the largest |reward|): rewards near the float
    # limit (1e308 + 1e308) would overflow, numbers in [-1, 1] cannot. Same formulas, rescaled.
    scale = rewards.abs().max() if rewards.numel() else rewards.new_ones(())
    scale = torch.where(scale > 0, scale, 1.0)
    unit = rewards / scale
    count = per_group_sum(torch.ones_like(rewards))
    mean = per_group_sum(unit) / count
    centred = unit - mean[group]

    # Zero variance, tested exactly (max == min), so float noise in the mean cannot make it trainable.
    group_max = rewards.new_full((num_groups,), -torch.inf)
    group_min = rewards.new_full((num_groups,), torch.inf)
    group_max = group_max.scatter_reduce(0, group, rewards, reduce="amax")
    group_min = group_min.scatter_reduce(0, group, rewards, reduce="amin")
    trainable = (group_max > group_min)[group]

    # Sample std (Bessel's correction, divide by n - 1), as TRL's `nanstd` in trl/trainer/utils.py,
    # used by GRPOTrainer for both scale_rewards="group" and "batch". DeepSeekMath does not say which.
    if scale_rewards == "group":
        variance = per_group_sum(centred**2) / (count - 1).clamp(min=1)
        advantages = centred / (variance.sqrt()[group] + eps / scale)
    elif scale_rewards == "batch":
        batch_std = unit.std(correction=1) if unit.numel() > 1 else unit.new_zeros(())
        advantages = centred / (batch_std + eps / scale)
    else:  # "none": Dr. GRPO drops the std, which over-weights groups that are nearly all right or wrong
        advantages = centred * scale
    return torch.where(trainable, advantages, 0.0), trainable


@dataclass(frozen=True)
class LossConfig:
    """How the per-token ratio is formed, clipped and aggregated; build one with `loss_preset`."""

    name: str
    ratio_level: Literal["token", "sequence"]  # sequence: GSPO's length-normalised sequence ratio
    # ppo_clip clips the update (PPO, GRPO); cispo clips the detached importance weight (CISPO).
    objective: Literal["ppo_clip", "cispo"]
    aggregation: Literal["token_mean", "constant", "sequence_mean"]
    eps_low: float
    eps_high: float
    scale_rewards: ScaleRewards = "group"  # what the trainer passes to advantages_from_rewards
    max_completion_length: int | None = None  # the constant of aggregation="constant"

    def __post_init__(self) -> None:
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"eps_low, eps_high must be >= 0: {self.eps_low}, {self.eps_high}")
        if self.aggregation == "constant" and not (self.max_completion_length or 0) > 0:
            raise ValueError("aggregation='constant' needs max_completion_length > 0")
        if self.objective == "cispo" and self.ratio_level != "token":
            raise ValueError("objective='cispo' clips per-token weights: use ratio_level='token'")


LOSS_PRESETS: dict[str, LossConfig] = {
    # GRPO's PPO-clip with DAPO's asymmetric clip (0.2 / 0.28, DAPO §4.1) and token-level mean
    # over the step: TRL's default, loss_type="dapo".
    "grpo": LossConfig(
        name="grpo", ratio_level="token", objective="ppo_clip", aggregation="token_mean",
        eps_low=0.2, eps_high=0.28,
    ),
    # Dr. GRPO: sum over tokens / (max_completion_length x rows), advantages only centred
    # (scale_rewards="none"). 512 is TRL's default; set it to your generation budget.
    "dr_grpo": LossConfig(
        name="dr_grpo", ratio_level="token", objective="ppo_clip", aggregation="constant",
        eps_low=0.2, eps_high=0.2, scale_rewards="none", max_completion_length=512,
    ),
    # GSPO: one ratio per sequence, clipped to [1 - 3e-4, 1 + 4e-4] (GSPO paper v2, §5.1).
    "gspo": LossConfig(
        name="gspo", ratio_level="sequence", objective="ppo_clip", aggregation="sequence_mean",
        eps_low=3e-4, eps_high=4e-4,
    ),
    # CISPO: the paper clips the weight to [1 - eps_low, 1 + eps_high], sets no lower bound in
    # practice (eps_low=1: weights may fall to 0) and does not print eps_high; 4.0 caps the weight
    # at 5.0, ScaleRL's eps_max=5 (arXiv 2510.13786), the value TRL recommends for loss_type="cispo".
    "cispo": LossConfig(
        name="cispo", ratio_level="token", objective="cispo", aggregation="token_mean",
        eps_low=1.0, eps_high=4.0,
    ),
}  # fmt: skip


def loss_preset(name: str, **overrides: Any) -> LossConfig:
    """The named preset, fields overridden: loss_preset("dr_grpo", max_completion_length=256)."""
    if name not in LOSS_PRESETS:
        raise ValueError(f"Unknown loss preset {name!r}: choose one of {', '.join(LOSS_PRESETS)}")
    return dataclasses.replace(LOSS_PRESETS[name], **overrides)


def loss_denominator(mask: torch.Tensor, config: LossConfig) -> torch.Tensor:
    """What the summed loss of these rows is divided by; add it up over micro-batches of one step."""
    trained_rows = (mask.sum(-1) > 0).sum()
    if config.aggregation == "token_mean":  # DAPO: every trained token of the step weighs the same
        return mask.sum()
    if config.aggregation == "constant":  # Dr. GRPO: a constant, so no length bias
        return trained_rows * (config.max_completion_length or 1)
    return trained_rows  # GSPO: every trained sequence weighs the same


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    denominator: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss to minimise, and metrics: clip_fraction, ratio_mean, logprob_abs_diff, kl (when
    ref_logprobs given).

    `denominator`: by default `loss_denominator(mask, config)`; with micro-batches, the step's total.
    """
    trained = mask.bool()
    tokens_per_row = trained.sum(-1)
    A = advantages.detach().to(new_logprobs.dtype)[:, None]  # one advantage per row, on each token
    # torch.where, not a product: context positions may hold garbage (NaN, inf) and must not leak in.
    log_ratio = torch.where(trained, new_logprobs - old_logprobs.detach(), 0.0)

    # Importance ratio r = pi_new / pi_old. Token level: r_t = exp(logp_new_t - logp_old_t).
    # GSPO: s_i = (pi_new(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t (logp_new - logp_old)),
    # the geometric mean of the token ratios, shared by all tokens of the sequence.
    if config.ratio_level == "sequence":
        row_log_ratio = log_ratio.sum(-1, keepdim=True) / tokens_per_row[:, None].clamp(min=1)
        ratio = row_log_ratio.exp().expand_as(log_ratio)
    else:
        ratio = log_ratio.exp()

    if config.objective == "ppo_clip":
        # PPO-clip as in GRPO (DeepSeekMath): -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
        low, high = 1 - config.eps_low, 1 + config.eps_high
        per_token = -torch.minimum(ratio * A, ratio.clamp(low, high) * A)
        # Clipped = the min took the flat branch, so the token gives no gradient (TRL's clip_ratio).
        clipped = ((ratio < low) & (A < 0)) | ((ratio > high) & (A > 0))
    else:
        # CISPO (MiniMax-M1): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp_new, sg = stop-gradient.
        # The weight is clipped, not the update: every token keeps a gradient.
        weight = ratio.clamp(1 - config.eps_low, 1 + config.eps_high).detach()
        per_token = -weight * A * new_logprobs
        clipped = (ratio > 1 + config.eps_high) | (ratio < 1 - config.eps_low)

    metrics: dict[str, torch.Tensor] = {}
    if ref_logprobs is not None:
        # KL(pi_new || pi_ref), k3 estimator as in DeepSeekMath: e^(ref-new) - (ref-new) - 1 >= 0
        ref_minus_new = torch.where(trained, ref_logprobs.detach() - new_logprobs, 0.0)
        kl = ref_minus_new.exp() - ref_minus_new - 1
        per_token = per_token + beta * kl
        metrics["kl"] = _masked_mean(kl, trained)

    per_token = torch.where(trained, per_token, 0.0)
    if config.aggregation == "sequence_mean":  # GSPO: mean over each sequence's tokens, then rows
        summed = (per_token.sum(-1) / tokens_per_row.clamp(min=1)).sum()
    else:  # token_mean (DAPO) and constant (Dr. GRPO) both sum every trained token
        summed = per_token.sum()
    if denominator is None:
        denominator = loss_denominator(mask, config)
    loss = summed / torch.as_tensor(denominator, dtype=summed.dtype).clamp(min=1)

    metrics["clip_fraction"] = _masked_mean(clipped.to(new_logprobs.dtype), trained)
    metrics["ratio_mean"] = _masked_mean(ratio, trained)
    # How far the trainer's logprobs of the sampled tokens are from the sampler's: on fresh
    # rollouts (before this step's update) it measures engine/trainer mismatch (vLLM or ours).
    metrics["logprob_abs_diff"] = _masked_mean(log_ratio.abs(), trained)
    return loss, metrics


def _masked_mean(values: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over trained tokens (0 when there are none), detached: a metric."""
    values = torch.where(trained, values.detach(), 0.0)
    return values.sum() / trained.sum().clamp(min=1)
