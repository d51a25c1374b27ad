"""The GRPO math: group-relative advantages and the clipped policy loss, as pure tensor functions.

Notation: a step holds rows (one trajectory each) of tokens. `mask` is 1 on trained (sampled)
tokens, 0 on context and padding. logp_new is the policy being trained, logp_old the sampler's
logprobs recorded at generation time, A_i the advantage of row i.

Papers: GRPO, DeepSeekMath (arXiv 2402.03300); DAPO (2503.14476); Dr. GRPO, "Understanding
R1-Zero-like Training" (2503.20783); GSPO, Qwen 2025 (2507.18071); CISPO, MiniMax-M1 (2506.13585).
Reference implementations read: huggingface/trl@f2cd57710ae3, trl/trainer/grpo_trainer.py; and
OpenPipe ART 0.5.23, src/art/loss.py (its `loss_fn="cispo"|"ppo"`, importance-sampling levels,
KL-shaped advantages and the options of the same names below) and src/art/preprocessing/pack.py
(advantage_balance).

Importance ratios (`LossConfig.ratio_level`, ART's `importance_sampling_level`), with
d_t = logp_new_t - logp_old_t over the trained tokens T_i of row i:
    token             r_t = exp(d_t)
    sequence          s_i = exp(mean_{t in T_i} d_t), shared by every token of the row (GSPO)
    average           (r_t + s_i) / 2
    geometric_average sqrt(r_t) * sqrt(s_i) = exp((d_t + log s_i) / 2)

Truncated rows (TRL's `mask_truncated_completions`): the caller passes their mask as a row of
zeros. A row of zeros counts nowhere: not in a numerator, not in a denominator, in any preset.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch

ScaleRewards = Literal["group", "batch", "none"]
RatioLevel = Literal["token", "sequence", "average", "geometric_average"]


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


def balance_advantages(advantages: torch.Tensor, balance: float) -> torch.Tensor:
    """ART's advantage_balance b in [-1, 1]: b > 0 scales negative advantages by 1 - b, b < 0
    scales positive ones by 1 + b (1: only positive advantages train; -1: only negative)."""
    if not -1 <= balance <= 1:
        raise ValueError(f"advantage_balance must be in [-1, 1], got {balance}")
    if balance > 0:
        return torch.where(advantages > 0, advantages, advantages * (1 - balance))
    if balance < 0:
        return torch.where(advantages < 0, advantages, advantages * (1 + balance))
    return advantages


@dataclass(frozen=True)
class LossConfig:
    """How the per-token ratio is formed, clipped and aggregated; build one with `loss_preset`."""

    name: str
    ratio_level: RatioLevel  # see the table in the module docstring
    # ppo_clip clips the update (PPO, GRPO); cispo clips the detached importance weight (CISPO).
    objective: Literal["ppo_clip", "cispo"]
    aggregation: Literal["token_mean", "constant", "sequence_mean"]
    eps_low: float
    eps_high: float
    scale_rewards: ScaleRewards = "group"  # what the trainer passes to advantages_from_rewards
    max_completion_length: int | None = None  # the constant of aggregation="constant"
    advantage_balance: float = 0.0  # applied to the advantages by `balance_advantages`
    # ART's KL-shaped advantages: A_t + coef * (mean KL - KL_t), KL_t = logp_src_t - logp_ref_t,
    # src the policy being trained ("current_learner") or the sampler ("sample").
    kl_penalty_coef: float = 0.0
    kl_penalty_source: Literal["current_learner", "sample"] = "current_learner"
    # ART's max_negative_advantage_importance_sampling_weight: the ratio capped at this before
    # clipping, whatever the advantage's sign (as ART does despite the name).
    ratio_max: float | None = None
    mask_ratio: bool = False  # ART's mask_prob_ratio: a ratio outside the clip range becomes 0
    kimi_k2_tau: float | None = None  # Kimi K2: A_t - tau * sg(logp_new_t - logp_old_t)
    # ART's precalculate_logprobs: logp_old is the trainer's own before the update (one
    # optimizer step per call here, so sg(logp_new)); the sampler's then only feed the
    # truncated importance weight min(exp(logp_old - logp_sampler), truncated_is_max).
    precalculate_logprobs: bool = False
    truncated_is_max: float | None = None
    # TRL's denominators count the step's all-equal groups too (their advantage is 0): their
    # sampled tokens and rows, added when TrainConfig(zero_variance_in_denominator=True).
    untrained_tokens: int = 0
    untrained_rows: int = 0

    def __post_init__(self) -> None:
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"eps_low, eps_high must be >= 0: {self.eps_low}, {self.eps_high}")
        if self.aggregation == "constant" and not (self.max_completion_length or 0) > 0:
            raise ValueError("aggregation='constant' needs max_completion_length > 0")
        if self.ratio_level not in ("token", "sequence", "average", "geometric_average"):
            raise ValueError(f"unknown ratio_level {self.ratio_level!r}")
        if not -1 <= self.advantage_balance <= 1:
            raise ValueError(f"advantage_balance must be in [-1, 1], got {self.advantage_balance}")
        if self.kl_penalty_coef < 0:
            raise ValueError(f"kl_penalty_coef must be >= 0, got {self.kl_penalty_coef}")


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
    # Also ART's default loss_fn="cispo" (epsilon 1.0, epsilon_high 4.0, src/art/loss.py).
    "cispo": LossConfig(
        name="cispo", ratio_level="token", objective="cispo", aggregation="token_mean",
        eps_low=1.0, eps_high=4.0,
    ),
    # ART's loss_fn="ppo": PPO-clip with a symmetric 0.2 (epsilon_high defaults to epsilon).
    "ppo": LossConfig(
        name="ppo", ratio_level="token", objective="ppo_clip", aggregation="token_mean",
        eps_low=0.2, eps_high=0.2,
    ),
}  # fmt: skip


def loss_preset(name: str, **overrides: Any) -> LossConfig:
    """The named preset, fields overridden: loss_preset("dr_grpo", max_completion_length=256)."""
    if name not in LOSS_PRESETS:
        raise ValueError(f"Unknown loss preset {name!r}: choose one of {', '.join(LOSS_PRESETS)}")
    return dataclasses.replace(LOSS_PRESETS[name], **overrides)


def loss_denominator(mask: torch.Tensor, config: LossConfig) -> torch.Tensor:
    """What the summed loss of these rows is divided by; add it up over micro-batches of one step."""
    trained_rows = (mask.sum(-1) > 0).sum() + config.untrained_rows
    if config.aggregation == "token_mean":  # DAPO: every trained token of the step weighs the same
        return mask.sum() + config.untrained_tokens
    if config.aggregation == "constant":  # Dr. GRPO: a constant, so no length bias
        return trained_rows * (config.max_completion_length or 1)
    return trained_rows  # GSPO: every trained sequence weighs the same


def importance_ratio(
    log_ratio: torch.Tensor, trained: torch.Tensor, level: RatioLevel
) -> torch.Tensor:
    """The ratio of every token at `level` (module docstring); `log_ratio` is 0 off `trained`."""
    token = log_ratio.exp()
    if level == "token":
        return token
    tokens_per_row = trained.sum(-1, keepdim=True).clamp(min=1)
    row_log_ratio = log_ratio.sum(-1, keepdim=True) / tokens_per_row  # log s_i
    if level == "sequence":
        return row_log_ratio.exp().expand_as(log_ratio)
    if level == "average":
        return (token + row_log_ratio.exp()) / 2
    return ((log_ratio + row_log_ratio) / 2).exp()  # geometric_average


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
    """Scalar loss to minimise, and metrics: clip_fraction, ratio_mean, logprob_abs_diff, kl (with
    beta and ref_logprobs), kl_policy_ref (with kl_penalty_coef and ref_logprobs).

    `denominator`: by default `loss_denominator(mask, config)`; with micro-batches, the step's total.
    """
    trained = mask.bool()
    tokens_per_row = trained.sum(-1)
    sampler_logprobs = old_logprobs.detach()
    # ART's precalculate_logprobs: the trainer's logprobs before this step's single update.
    old_logprobs = new_logprobs.detach() if config.precalculate_logprobs else sampler_logprobs
    # One advantage per row, on each token; per token once shaped (Kimi K2, KL penalty).
    A = advantages.detach().to(new_logprobs.dtype)[:, None].expand_as(new_logprobs)
    # torch.where, not a product: context positions may hold garbage (NaN, inf) and must not leak in.
    log_ratio = torch.where(trained, new_logprobs - old_logprobs, 0.0)
    ratio = importance_ratio(log_ratio, trained, config.ratio_level)
    raw_ratio = ratio  # the clip metrics read the ratio before the cap and the mask, as ART's
    low, high = 1 - config.eps_low, 1 + config.eps_high
    if config.ratio_max is not None:
        ratio = ratio.clamp(max=config.ratio_max)
    if config.mask_ratio:
        ratio = torch.where((ratio > low) & (ratio < high), ratio, 0.0)
    if config.kimi_k2_tau:
        A = A - config.kimi_k2_tau * log_ratio.detach()

    metrics: dict[str, torch.Tensor] = {}
    if config.kl_penalty_coef > 0 and ref_logprobs is not None:
        # ART's KL-shaped advantages: tokens that diverge more than average from the reference
        # get less advantage, those that diverge less get more (the shaping averages to zero).
        source = (
            new_logprobs.detach() if config.kl_penalty_source == "current_learner" else old_logprobs
        )
        kl_per_token = torch.where(trained, source - ref_logprobs.detach(), 0.0)
        mean_kl = _masked_mean(kl_per_token, trained)
        A = A + config.kl_penalty_coef * torch.where(trained, mean_kl - kl_per_token, 0.0)
        metrics["kl_policy_ref"] = mean_kl

    per_token, clipped = token_objective(config, ratio, raw_ratio, A, new_logprobs)
    if config.precalculate_logprobs and config.truncated_is_max is not None:
        # Truncated importance sampling: corrects for the sampler/trainer mismatch, capped.
        sampler_ratio = torch.where(trained, old_logprobs - sampler_logprobs, 0.0).exp()
        per_token = per_token * sampler_ratio.clamp(max=config.truncated_is_max)

    if ref_logprobs is not None and beta > 0:
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
    metrics["ratio_mean"] = _masked_mean(raw_ratio, trained)
    # How far the trainer's logprobs of the sampled tokens are from the sampler's: on fresh
    # rollouts (before this step's update) it measures engine/trainer mismatch (vLLM or ours).
    metrics["logprob_abs_diff"] = _masked_mean(
        torch.where(trained, new_logprobs - sampler_logprobs, 0.0).abs(), trained
    )
    return loss, metrics


def token_objective(
    config: LossConfig,
    ratio: torch.Tensor,
    raw_ratio: torch.Tensor,
    A: torch.Tensor,
    new_logprobs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token objective to minimise, and which tokens the clip holds back. `A` is per token
    (`policy_loss` spreads each row's advantage; the Tinker API sends one per token)."""
    low, high = 1 - config.eps_low, 1 + config.eps_high
    if config.objective == "ppo_clip":
        # PPO-clip as in GRPO (DeepSeekMath): -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
        per_token = -torch.minimum(ratio * A, ratio.clamp(low, high) * A)
        # Clipped = the min took the flat branch, so the token gives no gradient (TRL's clip_ratio).
        clipped = ((raw_ratio < low) & (A < 0)) | ((raw_ratio > high) & (A > 0))
    else:
        # CISPO (MiniMax-M1): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp_new, sg = stop-gradient.
        # The weight is clipped, not the update: every token keeps a gradient.
        weight = ratio.clamp(low, high).detach()
        per_token = -weight * A * new_logprobs
        clipped = (raw_ratio > high) | (raw_ratio < low)
    return per_token, clipped


def _masked_mean(values: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over trained tokens (0 when there are none), detached: a metric."""
    values = torch.where(trained, values.detach(), 0.0)
    return values.sum() / trained.sum().clamp(min=1)
