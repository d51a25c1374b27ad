"""What one optimizer step does: AdamW's settings, checked where they are built."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from art_backend._errors import InvalidRequestError


@dataclass(frozen=True)
class OptimizerSettings:
    """What one optimizer step does with the gradients of a step.

    The settings check themselves when built, whichever route built them (a train step's
    config, the Tinker API's `optim_step`, a replayed step's record): a learning rate, weight
    decay or eps that is not finite turns every weight NaN at the first step, so a value out of
    bounds is an `InvalidRequestError` naming the field, before any step runs.
    """

    learning_rate: float = 1e-5
    max_grad_norm: float = 1.0  # math.inf: no clipping
    weight_decay: float = 0.0
    micro_batch_tokens: int = 2048  # rows x padded length per forward pass: bounds memory
    gradient_checkpointing: bool = False
    # AdamW's betas and eps for this step; None keeps the optimizer's (0.9, 0.99), 1e-8. The
    # Tinker API sends them with every step.
    betas: tuple[float, float] | None = None
    eps: float | None = None

    def __post_init__(self) -> None:
        _finite_at_least("learning_rate", self.learning_rate, 0.0)
        _finite_at_least("weight_decay", self.weight_decay, 0.0)
        if math.isnan(self.max_grad_norm) or self.max_grad_norm <= 0:
            raise InvalidRequestError(
                f"max_grad_norm is {self.max_grad_norm}; it must be above 0 (math.inf: no "
                "clipping).",
                param="max_grad_norm",
            )
        if self.eps is not None and not (math.isfinite(self.eps) and self.eps > 0):
            raise InvalidRequestError(
                f"eps is {self.eps}; it must be a finite number above 0.", param="eps"
            )
        for number, beta in enumerate(self.betas or ()):
            if not 0 <= beta < 1:  # NaN fails this too
                raise InvalidRequestError(
                    f"betas[{number}] is {beta}; each beta must lie in [0, 1).", param="betas"
                )
        if self.micro_batch_tokens < 1:
            raise InvalidRequestError(
                f"micro_batch_tokens is {self.micro_batch_tokens}; it must be at least 1.",
                param="micro_batch_tokens",
            )

    @classmethod
    def from_config(cls, config: Any, learning_rate: float | None = None) -> OptimizerSettings:
        """The optimizer part of a `TrainConfig` or `TrainSFTConfig` (both carry these fields);
        `learning_rate` is this step's when the config holds a schedule (SFT's list of rates)."""
        return cls(
            learning_rate=config.learning_rate if learning_rate is None else learning_rate,
            max_grad_norm=config.max_grad_norm,
            weight_decay=config.weight_decay,
            micro_batch_tokens=config.micro_batch_tokens,
            gradient_checkpointing=config.gradient_checkpointing,
        )


def _finite_at_least(name: str, value: float, low: float) -> None:
    """A finite `value` of at least `low`, else a 400 naming it."""
    if not (math.isfinite(value) and value >= low):
        raise InvalidRequestError(
            f"{name} is {value}; it must be a finite number of at least {low:g}.", param=name
        )
