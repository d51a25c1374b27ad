"""The Tinker API's loss functions over one datum's target logprobs, as a table: name -> loss.

Tinker's losses are sums over tokens, not means (a caller who wants a mean scales its weights or
advantages by 1/N, as the cookbook's recipes do). With lp[t] the trainer's logprob of
target_tokens[t] at position t (`training._target_rows`), q[t] the sampler's (`logprobs`),
A[t] the `advantages` and r[t] = exp(lp[t] - q[t]):

    cross_entropy        -weights[t] * lp[t]                              (weights default to 1)
    importance_sampling  -r[t] * A[t]
    ppo                  -min(r[t] A[t], clip(r[t], low, high) A[t])      low, high: 0.8, 1.2
    cispo                -sg(clip(r[t], low, high)) * lp[t] * A[t]        low, high: 0.0, 4.0

`low`, `high` are `loss_fn_config`'s `clip_low_threshold`, `clip_high_threshold` (Tinker's
defaults above). The three policy losses are our own per-token objective
(`training._grpo.token_objective`) with the `ppo` and `cispo` presets at eps_low = 1 - low and
eps_high = high - 1 (importance sampling: PPO with no clip). `forward_backward` answers each
datum's `logprobs` and `elementwise_loss`, and the metric `loss:sum`. A new loss is a row of
`LOSSES`; the SDK's other names are refused by name (`NOT_SERVED_YET`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from art_backend.training._grpo import loss_preset, token_objective

# (target logprobs [n], the datum's loss_fn_inputs as float tensors [n], loss_fn_config)
Elementwise = Callable[
    [torch.Tensor, dict[str, torch.Tensor], dict[str, float | str]], torch.Tensor
]
CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")


@dataclass(frozen=True)
class TinkerLoss:
    """One served loss: the loss_fn_inputs it reads, its config keys (with defaults), its formula."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    config_defaults: dict[str, float]
    elementwise: Elementwise


def cross_entropy(
    logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float | str]
) -> torch.Tensor:
    """-weights * logprob, per token."""
    weights = inputs.get("weights")
    return -logprobs if weights is None else -weights * logprobs


def policy_loss(preset: str, clipped: bool) -> Elementwise:
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


POLICY_INPUTS = ("target_tokens", "logprobs", "advantages")
LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(("target_tokens",), ("weights",), {}, cross_entropy),
    "importance_sampling": TinkerLoss(POLICY_INPUTS, (), {}, policy_loss("ppo", clipped=False)),
    "ppo": TinkerLoss(
        POLICY_INPUTS,
        (),
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        policy_loss("ppo", clipped=True),
    ),
    "cispo": TinkerLoss(
        POLICY_INPUTS,
        (),
        {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
        policy_loss("cispo", clipped=True),
    ),
}

# The SDK's other loss names (tinker 0.38's LossFnType): refused, named, until they are rows.
NOT_SERVED_YET = ("dro", "gspo", "stable_reinforce", "custom")


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
    if CLIP_KEYS[0] in resolved:
        low, high = (float(resolved[key]) for key in CLIP_KEYS)
        if not 0 <= low <= 1 <= high:
            raise ValueError(
                f"clip thresholds must satisfy 0 <= clip_low_threshold <= 1 <= "
                f"clip_high_threshold; got {low}, {high}"
            )
    return resolved
