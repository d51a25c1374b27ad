"""The loss registry: every loss the trainer's `forward_backward` takes, in one room.

Two kinds, both over the one log-probability path (`_logprobs`):

- a whole micro-batch's loss, its share of a step's (`BatchLoss`): `GRPOLoss` (ART's `train()`:
  the policy loss of `_grpo` with one of its presets, grpo, dapo, cispo, ...; `_grpo.LOSS_PRESETS`),
  `SFTLoss` (`train_sft`: cross-entropy over the trained tokens, a mean over the step's);
- a datum's elementwise loss, summed (the Tinker API's `LOSSES` below), which `DatumLoss` runs
  over each row of a micro-batch, keeping each datum's logprobs and losses for the answer.

Tinker's losses are sums over tokens, not means (a caller who wants a mean scales its weights or
advantages by 1/N, as the cookbook's recipes do). With lp[t] the trainer's logprob of
target_tokens[t] at position t, q[t] the sampler's (`logprobs`), A[t] the `advantages` and
r[t] = exp(lp[t] - q[t]):

    cross_entropy        -weights[t] * lp[t]                              (weights default to 1)
    importance_sampling  -r[t] * A[t]
    ppo                  -min(r[t] A[t], clip(r[t], low, high) A[t])      low, high: 0.8, 1.2
    cispo                -sg(clip(r[t], low, high)) * lp[t] * A[t]        low, high: 0.0, 4.0
    dro                  -(lp[t] A[t] - beta/2 (lp[t] - q[t])^2)          beta: 0.05
    gspo                 ppo's, with r[t] = sg(s) * exp(lp[t] - sg(lp[t])),  low, high: 0.8, 1.2
                         s = exp(mean of lp - q over sequence_ratio_mask)   (all tokens if absent)
    stable_reinforce     -sg(clip(r[t], low, high)) * lp[t] * A[t] over     low, high: 0.0, 2.0
                         the sampled tokens, q[t] the sampler's recorded logprob

Sources, Tinker's loss pages: https://tinker-docs.thinkingmachines.ai/tinker/losses/dro (DRO;
the page states no default beta: ours is its example's 0.05), .../losses/gspo (GSPO-token: the
sequence ratio's value with each token's own gradient), .../losses/stable-reinforce (which
publishes the inputs, not the objective). Our `stable_reinforce` is truncated importance-sampled
REINFORCE (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training": the weight sg(min(r, C)), C = 2) on what the sampler recorded at sampling time
(`tinker._stability`): q is the logprob the engine answered for each sampled token, and only
tokens a datum's provenance names as sampled are trained; its datums must carry provenance.

`low`, `high` are `loss_fn_config`'s `clip_low_threshold`, `clip_high_threshold` (Tinker's
defaults above). The token-level policy losses are our own per-token objective
(`training._grpo.token_objective`) with the `ppo` and `cispo` presets at eps_low = 1 - low and
eps_high = high - 1 (importance sampling: PPO with no clip; gspo: PPO on the sequence ratio;
stable_reinforce: cispo at low 0). `forward_backward` answers each datum's `logprobs` and
`elementwise_loss`, and the metric `loss:sum`. A new loss is a row of `LOSSES`; the SDK's other
name, `custom` (which the SDK computes itself and sends as cross_entropy), is refused by name
(`NOT_SERVED_YET`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from art_backend.training._grpo import LossConfig, loss_preset, policy_loss, token_objective
from art_backend.training._rows import Rows
from art_backend.training._step_metrics import StepMetrics

# (target logprobs [n], the datum's loss_fn_inputs as float tensors [n], loss_fn_config)
Elementwise = Callable[
    [torch.Tensor, dict[str, torch.Tensor], dict[str, float | str]], torch.Tensor
]
CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")


@dataclass(frozen=True)
class TinkerLoss:
    """One served loss: the loss_fn_inputs it reads, its config keys (with defaults), its formula,
    and whether its datums name the sampled sequences behind their tokens (`provenance`)."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    config_defaults: dict[str, float]
    elementwise: Elementwise
    provenance: bool = False


def cross_entropy(
    logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float | str]
) -> torch.Tensor:
    """-weights * logprob, per token."""
    weights = inputs.get("weights")
    return -logprobs if weights is None else -weights * logprobs


def elementwise_policy_loss(preset: str, clipped: bool) -> Elementwise:
    """A policy-gradient loss of the table: our `preset`'s per-token objective."""

    def elementwise(
        logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float | str]
    ) -> torch.Tensor:
        if clipped:
            low, high = (float(config[key]) for key in CLIP_KEYS)
            settings = loss_preset(preset, eps_low=1 - low, eps_high=high - 1)
        else:
            settings = loss_preset(preset, eps_low=math.inf, eps_high=math.inf)
        ratio = (logprobs - inputs["logprobs"]).exp()
        per_token, _ = token_objective(settings, ratio, ratio, inputs["advantages"], logprobs)
        return per_token

    return elementwise


def dro(
    logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float | str]
) -> torch.Tensor:
    """DRO's per-token loss: the policy gradient less a quadratic pull towards the sampler."""
    penalty = (logprobs - inputs["logprobs"]) ** 2
    return -(logprobs * inputs["advantages"] - 0.5 * float(config["beta"]) * penalty)


def gspo(
    logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float | str]
) -> torch.Tensor:
    """GSPO-token: every token carries the datum's sequence ratio (the geometric mean of its
    marked tokens' ratios) as its value and its own log-probability's gradient, PPO-clipped."""
    mask = inputs.get("sequence_ratio_mask")
    marked = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else mask != 0
    token_log_ratio = logprobs.detach() - inputs["logprobs"]
    # A datum with no marked token has no sequence ratio: ratio 1 (the sampler's own policy).
    log_ratio = torch.where(marked, token_log_ratio, 0.0).sum() / marked.sum().clamp(min=1)
    ratio = torch.exp(log_ratio + logprobs - logprobs.detach())
    low, high = (float(config[key]) for key in CLIP_KEYS)
    settings = loss_preset("ppo", eps_low=1 - low, eps_high=high - 1)
    per_token, _ = token_objective(settings, ratio, ratio.detach(), inputs["advantages"], logprobs)
    return per_token


POLICY_INPUTS = ("target_tokens", "logprobs", "advantages")
LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(("target_tokens",), ("weights",), {}, cross_entropy),
    "importance_sampling": TinkerLoss(
        POLICY_INPUTS, (), {}, elementwise_policy_loss("ppo", clipped=False)
    ),
    "ppo": TinkerLoss(
        POLICY_INPUTS,
        (),
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        elementwise_policy_loss("ppo", clipped=True),
    ),
    "cispo": TinkerLoss(
        POLICY_INPUTS,
        (),
        {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
        elementwise_policy_loss("cispo", clipped=True),
    ),
    "dro": TinkerLoss(POLICY_INPUTS, (), {"beta": 0.05}, dro),
    "gspo": TinkerLoss(
        POLICY_INPUTS,
        ("sequence_ratio_mask",),
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        gspo,
    ),
    # `logprobs` optional: the sampler's recorded ones replace what a datum sends
    # (`tinker._stability.resolve_provenance`), and its advantages count on sampled tokens only.
    "stable_reinforce": TinkerLoss(
        ("target_tokens", "advantages"),
        ("logprobs",),
        {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0},
        elementwise_policy_loss("cispo", clipped=True),
        provenance=True,
    ),
}

# The SDK's other loss name (tinker 0.38's LossFnType): `forward_backward_custom` computes the
# loss in the SDK and sends cross_entropy; `custom` itself is refused by name.
NOT_SERVED_YET = ("custom",)


def resolved_config(loss: TinkerLoss, config: dict[str, float | str]) -> dict[str, float | str]:
    """`config` over the loss's defaults; a ValueError saying what is wrong."""
    unknown = sorted(set(config) - set(loss.config_defaults))
    if unknown:
        raise ValueError(
            f"loss_fn_config keys {unknown} are not read by this loss (it reads "
            f"{sorted(loss.config_defaults) or 'none'})"
        )
    resolved: dict[str, float | str] = {**loss.config_defaults, **config}
    for key, value in resolved.items():
        if isinstance(value, str) or not math.isfinite(value):
            raise ValueError(f"loss_fn_config[{key!r}] must be a finite number, not {value!r}")
    if float(resolved.get("beta", 0.0)) < 0:
        raise ValueError(f"beta must be at least 0 (a penalty's weight); got {resolved['beta']}")
    if CLIP_KEYS[0] in resolved:
        low, high = (float(resolved[key]) for key in CLIP_KEYS)
        if not 0 <= low <= 1 <= high:
            raise ValueError(
                f"clip thresholds must satisfy 0 <= clip_low_threshold <= 1 <= "
                f"clip_high_threshold; got {low}, {high}"
            )
    return resolved


# ------------------------------------------------------------------------- micro-batch losses


class BatchLoss(Protocol):
    """A micro-batch's loss, as `LoraTrainer.forward_backward` takes it."""

    @property
    def needs_reference(self) -> bool:
        """Whether it reads the reference (base model) logprobs."""
        ...

    def __call__(
        self,
        batch: Rows,
        logprobs: torch.Tensor,
        reference: torch.Tensor | None,
        totals: StepMetrics,
    ) -> torch.Tensor:
        """The micro-batch's scalar loss from its logprobs (aligned with `batch`); adds its
        own metrics to `totals`."""
        ...


@dataclass
class GRPOLoss:
    """The policy loss of ART's `train()` (`_grpo.policy_loss`), over the step's denominator."""

    config: LossConfig
    beta: float
    denominator: torch.Tensor

    @property
    def needs_reference(self) -> bool:
        # The reference (the base model: adapter disabled) for beta's KL and ART's KL penalty.
        return self.beta > 0 or self.config.kl_penalty_coef > 0

    def __call__(
        self,
        batch: Rows,
        logprobs: torch.Tensor,
        reference: torch.Tensor | None,
        totals: StepMetrics,
    ) -> torch.Tensor:
        loss, parts = policy_loss(
            logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.trained_mask,
            self.config,
            ref_logprobs=reference,
            beta=self.beta,
            denominator=self.denominator,
        )
        tokens = int(batch.trained_mask.sum())
        totals.clipped_sum += float(parts["clip_fraction"]) * tokens
        totals.ratio_sum += float(parts["ratio_mean"]) * tokens
        totals.logprob_diff_sum += float(parts["logprob_abs_diff"]) * tokens
        totals.kl_sum += float(parts.get("kl", 0.0)) * tokens
        totals.kl_policy_ref_sum += float(parts.get("kl_policy_ref", 0.0)) * tokens
        return loss


@dataclass
class SFTLoss:
    """Cross-entropy of the trained tokens, divided by the step's trained tokens."""

    denominator: int
    needs_reference: bool = False

    def __call__(
        self,
        batch: Rows,
        logprobs: torch.Tensor,
        reference: torch.Tensor | None,
        totals: StepMetrics,
    ) -> torch.Tensor:
        return -torch.where(batch.trained_mask, logprobs, 0.0).sum() / self.denominator


@dataclass
class DatumLoss:
    """A Tinker loss of `LOSSES` over each row of a micro-batch: a datum of n tokens is a row
    scoring positions 1..n (`tinker._datums`), its id in `trajectory_ids`. Keeps each datum's
    logprobs and elementwise loss (detached, on the CPU) for the answer."""

    loss: TinkerLoss
    config: dict[str, float | str]
    needs_reference: bool = False
    logprobs: dict[int, torch.Tensor] = field(default_factory=dict)
    losses: dict[int, torch.Tensor] = field(default_factory=dict)

    def __call__(
        self,
        batch: Rows,
        logprobs: torch.Tensor,
        reference: torch.Tensor | None,
        totals: StepMetrics,
    ) -> torch.Tensor:
        total = logprobs.new_zeros(())
        for line, length in enumerate(batch.lengths.tolist()):
            scored = logprobs[line, 1:length]
            inputs = {name: values[line, 1:length] for name, values in batch.token_inputs.items()}
            values = self.loss.elementwise(scored, inputs, self.config)
            datum = int(batch.trajectory_ids[line])
            self.logprobs[datum] = scored.detach().cpu()
            self.losses[datum] = values.detach().cpu()
            total = total + values.sum()
        return total
