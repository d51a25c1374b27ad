"""Training settings and results as the user writes and reads them (validated before sending)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from art_core._strict import StrictModel

DEFAULT_TARGET_MODULES = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
]


class _Config(StrictModel):
    # A misspelt option is an error here, not silently ignored by the backend; so is a value
    # assigned after construction (`config.learning_rate = -1`).
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoRAConfig(_Config):
    """The adapter trained on the base model. alpha/r = 2 with lr 1e-5 is the tested default."""

    r: int = Field(16, ge=1, le=1024)
    alpha: float = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))


class TrainConfig(_Config):
    """One GRPO step. `loss` picks a preset (grpo, dr_grpo, gspo, cispo); fields override it."""

    learning_rate: float = Field(1e-5, gt=0, le=1)
    loss: Literal["grpo", "dr_grpo", "gspo", "cispo"] = "grpo"
    beta: float = Field(0.0, ge=0)  # KL to the base model; 0 skips the reference forward
    scale_rewards: Literal["group", "batch", "none"] | None = None
    epsilon: float | None = Field(None, ge=0)
    epsilon_high: float | None = Field(None, ge=0)
    max_completion_length: int | None = Field(None, ge=1)
    mask_truncated: bool = False  # drop rows whose completion hit max_tokens (counted)
    max_length: int | None = Field(None, ge=2)  # longer rows are dropped and counted
    micro_batch_tokens: int = Field(2048, ge=16)  # padded tokens per forward: bounds memory
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    gradient_checkpointing: bool = False
    # > 0: the backend holds the submitted groups on its review page (/review) this long, or
    # until a person approves them, then applies their flags and reward overrides.
    review_hold_seconds: float = Field(0.0, ge=0, le=7 * 24 * 3600)


class TrainSFTConfig(_Config):
    """Supervised fine-tuning on assistant turns (a warm start before RL)."""

    learning_rate: float = Field(1e-4, gt=0, le=1)
    batch_size: int = Field(8, ge=1)
    epochs: int = Field(1, ge=1, le=100)
    max_length: int | None = Field(None, ge=2)
    micro_batch_tokens: int = Field(2048, ge=16)
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    gradient_checkpointing: bool = False


class TrainResult(BaseModel):
    """What a training step did: the model's step after it, and the step's metrics."""

    # Read from the server, not written by a user: a newer server's extra fields are ignored.

    step: int
    metrics: dict[str, float] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    # Each trained trajectory's GRPO advantage, by trajectory id (0 in a zero-variance group).
    advantages: dict[str, float] = Field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.metrics[key]


class TokenPrice(_Config):
    """What a hosted model charges, in dollars per million tokens (for judge cost accounting)."""

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million
        ) / 1e6
