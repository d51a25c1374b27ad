"""The Tinker API's loss functions over one datum's target logprobs, as a table: name -> loss.

Tinker's losses are sums over tokens, not means (a caller who wants a mean puts 1/N in the
weights, as the cookbook's supervised recipes do). With lp[t] the trainer's logprob of
target_tokens[t] at position t (`training._target_rows`):

    cross_entropy    elementwise[t] = -weights[t] * lp[t]          (weights default to 1)

`forward_backward` answers each datum's `logprobs` and `elementwise_loss`, and the metric
`loss:sum` (the sum over every datum). A new loss is a row of `LOSSES`; the names the SDK knows
that are not rows yet are refused by name (`NOT_SERVED_YET`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# (target logprobs [n], the datum's loss_fn_inputs as float tensors [n], loss_fn_config)
Elementwise = Callable[
    [torch.Tensor, dict[str, torch.Tensor], dict[str, float | str]], torch.Tensor
]


@dataclass(frozen=True)
class TinkerLoss:
    """One served loss: the loss_fn_inputs it reads (target_tokens always) and its formula."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    config_keys: tuple[str, ...]
    elementwise: Elementwise


def cross_entropy(
    logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float | str]
) -> torch.Tensor:
    """-weights * logprob, per token."""
    weights = inputs.get("weights")
    return -logprobs if weights is None else -weights * logprobs


LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(("target_tokens",), ("weights",), (), cross_entropy),
}

# The SDK's other loss names (tinker 0.38's LossFnType): refused, named, until they are rows.
NOT_SERVED_YET = (
    "importance_sampling",
    "ppo",
    "cispo",
    "dro",
    "gspo",
    "stable_reinforce",
    "custom",
)
