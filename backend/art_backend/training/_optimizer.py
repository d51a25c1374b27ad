"""What one optimizer step does: AdamW's settings, checked where they are built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OptimizerSettings:
    """What one optimizer step does with the gradients of a step."""

    learning_rate: float = 1e-5
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    micro_batch_tokens: int = 2048  # rows x padded length per forward pass: bounds memory
    gradient_checkpointing: bool = False
    # AdamW's betas and eps for this step; None keeps the optimizer's (0.9, 0.99), 1e-8. The
    # Tinker API sends them with every step.
    betas: tuple[float, float] | None = None
    eps: float | None = None

    @classmethod
    def from_config(cls, config: Any) -> OptimizerSettings:
        """The optimizer part of a `TrainConfig` or `TrainSFTConfig` (both carry these fields)."""
        return cls(
            learning_rate=config.learning_rate,
            max_grad_norm=config.max_grad_norm,
            weight_decay=config.weight_decay,
            micro_batch_tokens=config.micro_batch_tokens,
            gradient_checkpointing=config.gradient_checkpointing,
        )
