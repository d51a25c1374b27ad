"""Training settings and results as the user writes and reads them (validated before sending)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_core._unknown_fields import StrictModel, check_names
from art_core.errors import UnsupportedOptionError

__all__ = ["LoRAConfig", "TokenPrice", "TrainConfig", "TrainResult", "TrainSFTConfig"]

MAX_LORA_ALPHA = 1e6
MIN_LORA_SCALE = 1e-30  # above float32's smallest normal number (1.2e-38)
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
    # The adapter's output is scaled by alpha/r in float32: bounded so that the scale stays a
    # finite, non-zero float32 (1e308 registered, then every answer was a 500).
    alpha: float = Field(32.0, gt=0, le=MAX_LORA_ALPHA)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: list(DEFAULT_TARGET_MODULES), min_length=1
    )

    @model_validator(mode="after")
    def _scale_is_a_float32(self) -> LoRAConfig:
        if self.alpha / self.r < MIN_LORA_SCALE:
            raise ValueError(
                f"alpha/r = {self.alpha / self.r:g} is too small to scale the adapter in float32 "
                f"(at least {MIN_LORA_SCALE:g}); alpha = 2 * r is the usual choice"
            )
        return self


class TrainConfig(_Config):
    """One GRPO step. `loss` picks a preset (grpo, dr_grpo, gspo, cispo, ppo); fields override it.

    The fields after `review_hold_seconds` carry ART's `backend.train` options of the same
    names (see `train_config_from_art`); their defaults leave the preset as it is.
    """

    # A TrainConfig is what the server receives; a gate runs the user's code on the client.
    unknown_field_hints: ClassVar[dict[str, str]] = {
        "promote_if": "A promotion gate runs your evaluation on the client, so it is an "
        "argument of the call, not a setting sent to the server: "
        "model.train(groups, promote_if=art.PromotionGate(...)).",
    }

    learning_rate: float = Field(1e-5, gt=0, le=1)
    loss: Literal["grpo", "dr_grpo", "gspo", "cispo", "ppo"] = "grpo"
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
    # True: the loss's denominator also counts the all-equal groups' tokens (rows for the
    # sequence-mean and constant losses), as TRL's does; they still do not train (see the docs).
    zero_variance_in_denominator: bool = False
    # > 0: the backend holds the submitted groups on its review page (/review) this long, or
    # until a person approves them, then applies their flags and reward overrides.
    review_hold_seconds: float = Field(0.0, ge=0, le=7 * 24 * 3600)
    # ART's options. None: the preset's level (token; sequence for gspo).
    importance_sampling_level: (
        Literal["token", "sequence", "average", "geometric_average"] | None
    ) = None
    advantage_balance: float = Field(0.0, ge=-1, le=1)  # > 0 shrinks negative advantages
    kl_penalty_coef: float = Field(0.0, ge=0)  # ART's KL-shaped advantages (not `beta`)
    kl_penalty_source: Literal["current_learner", "sample"] = "current_learner"
    max_negative_advantage_importance_sampling_weight: float | None = Field(None, gt=0)
    mask_prob_ratio: bool = False
    kimi_k2_tau: float | None = None
    precalculate_logprobs: bool = False
    truncated_importance_sampling: float | None = Field(None, gt=0)
    num_trajectories_learning_rate_multiplier_power: float = 0.0


# ART 0.5.23's `LocalBackend.train` keywords and their defaults (src/art/local/backend.py).
ART_TRAIN_DEFAULTS: dict[str, Any] = {
    "learning_rate": 5e-6,
    "loss_fn": "cispo",
    "loss_fn_config": None,
    "normalize_advantages": True,
    "adam_params": None,
    "kl_penalty_coef": 0.0,
    "kl_penalty_reference_step": None,
    "kl_ref_adapter_path": None,
    "kl_penalty_source": "current_learner",
    "epsilon": None,
    "epsilon_high": None,
    "advantage_balance": 0.0,
    "scale_rewards": True,
    "importance_sampling_level": "token",
    "max_negative_advantage_importance_sampling_weight": None,
    "mask_prob_ratio": False,
    "kimi_k2_tau": None,
    "precalculate_logprobs": False,
    "allow_training_without_logprobs": False,
    "plot_tensors": False,
    "truncated_importance_sampling": None,
    "scale_learning_rate_by_reward_std_dev": False,
    "logprob_calculation_chunk_size": 1024,
    "packed_sequence_length": None,
    "num_trajectories_learning_rate_multiplier_power": 0.0,
    "save_checkpoint": True,
    "optimizer_save_interval": 5,
    "final_training_step": None,
    "grad_accumulation_sequences": None,
    "verbose": False,
}

# ART's options passed through under the same TrainConfig field name.
_SAME_NAME = (
    "learning_rate", "kl_penalty_coef", "kl_penalty_source", "advantage_balance",
    "importance_sampling_level", "max_negative_advantage_importance_sampling_weight",
    "mask_prob_ratio", "kimi_k2_tau", "precalculate_logprobs", "truncated_importance_sampling",
    "num_trajectories_learning_rate_multiplier_power",
)  # fmt: skip
# Our TrainConfig fields ART has no keyword for, also accepted as keywords.
TRAIN_EXTRA_KEYWORDS = (
    "beta", "max_completion_length", "mask_truncated", "max_length", "micro_batch_tokens",
    "max_grad_norm", "weight_decay", "gradient_checkpointing", "review_hold_seconds",
    "zero_variance_in_denominator",
)  # fmt: skip
# ART's options whose only honourable value here is the default: why, and what to do instead.
_ONLY_DEFAULT = {
    "loss_fn_config": "ART's LocalBackend refuses it too; the loss is set by loss_fn, epsilon "
    "and the other keywords.",
    "adam_params": "the optimizer is AdamW with betas (0.9, 0.99); set weight_decay= and "
    "max_grad_norm= instead.",
    "kl_penalty_reference_step": "the KL reference is the base model (the adapter disabled).",
    "kl_ref_adapter_path": "the KL reference is the base model (the adapter disabled).",
    "plot_tensors": "this backend does not plot; the step's metrics and history hold its numbers.",
    "scale_learning_rate_by_reward_std_dev": "ART's LocalBackend does not apply it either; set "
    "learning_rate= yourself.",
    "grad_accumulation_sequences": "this backend takes one optimizer step per train call, over "
    "all rows (micro_batch_tokens= bounds the memory of each forward).",
}


def train_config_from_art(options: Mapping[str, Any]) -> tuple[TrainConfig, dict[str, Any]]:
    """ART's `backend.train` keywords as our TrainConfig, with ART's defaults for the rest.

    Returns the config and the client-side options (`save_checkpoint`, `verbose`). An unknown
    keyword raises `UnknownFieldError`; a value this backend cannot honour raises
    `UnsupportedOptionError` saying what to use. Options with no effect on the math here are
    accepted: `allow_training_without_logprobs` (every recorded completion has its sampler
    logprobs), `logprob_calculation_chunk_size` (we compute only the trained positions' logits),
    `optimizer_save_interval` (the optimizer state is saved with every checkpoint) and
    `final_training_step` (ART's LocalBackend ignores it too).
    """
    check_names(
        "backend.train()",
        options,
        [*ART_TRAIN_DEFAULTS, *TRAIN_EXTRA_KEYWORDS],
        hints={
            "loss": "ART's keyword is loss_fn ('cispo' or 'ppo'); for our other presets pass "
            "config=art.TrainConfig(loss=...).",
        },
    )
    given = {**ART_TRAIN_DEFAULTS, **options}
    for name, why in _ONLY_DEFAULT.items():
        if given[name] != ART_TRAIN_DEFAULTS[name]:
            raise UnsupportedOptionError(
                f"backend.train(): {name}={given[name]!r} is not supported here: {why}"
            )
    loss_fn = given["loss_fn"]
    if loss_fn not in ("cispo", "ppo"):
        raise UnsupportedOptionError(
            f"backend.train(): loss_fn={loss_fn!r}: use 'cispo' (the default) or 'ppo', as ART's "
            "LocalBackend; for our presets grpo, dr_grpo and gspo pass "
            "config=art.TrainConfig(loss=...)."
        )
    # ART's clip defaults (src/art/loss.py): PPO 0.2 and epsilon_high = epsilon; CISPO 1.0 and
    # 4.0 (a weight in [0, 5]), where epsilon alone leaves epsilon_high at 4.0.
    if loss_fn == "ppo":
        epsilon = 0.2 if given["epsilon"] is None else given["epsilon"]
        epsilon_high = epsilon if given["epsilon_high"] is None else given["epsilon_high"]
    else:
        epsilon = 1.0 if given["epsilon"] is None else given["epsilon"]
        epsilon_high = 4.0 if given["epsilon_high"] is None else given["epsilon_high"]
    scale_rewards = given["scale_rewards"]
    if isinstance(scale_rewards, bool):
        scale_rewards = "group" if scale_rewards else "none"
    if not given["normalize_advantages"]:  # ART's older name for scale_rewards=False
        scale_rewards = "none"
    for name in ("logprob_calculation_chunk_size", "optimizer_save_interval"):
        if not (isinstance(given[name], int) and given[name] >= 1):
            raise UnsupportedOptionError(f"backend.train(): {name} must be an integer >= 1")
    fields: dict[str, Any] = {name: given[name] for name in _SAME_NAME}
    fields.update(
        loss=loss_fn,
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        scale_rewards=scale_rewards,
        # ART drops sequences longer than its packed length; so do we, counted.
        max_length=given["packed_sequence_length"],
    )
    fields.update({name: options[name] for name in TRAIN_EXTRA_KEYWORDS if name in options})
    if "max_length" in options and given["packed_sequence_length"] is not None:
        raise UnsupportedOptionError(
            "backend.train(): packed_sequence_length and max_length are one option: pass one."
        )
    client = {"save_checkpoint": bool(given["save_checkpoint"]), "verbose": bool(given["verbose"])}
    return TrainConfig(**fields), client


SFT_AUTO_BATCH_SIZE = 2  # what batch_size="auto" means: ART's LocalBackend default
_LearningRate = Annotated[float, Field(gt=0, le=1)]
# A schedule may reach 0 (ART's linear decay ends there); a single rate may not.
_ScheduledRate = Annotated[float, Field(ge=0, le=1)]


class TrainSFTConfig(_Config):
    """Supervised fine-tuning on assistant turns (a warm start before RL). ART's fields first.

    `learning_rate` is one rate, or a schedule with one rate per batch (all epochs counted;
    `art_core.utils.sft.create_lr_schedule` makes one). `assistant_turns="last"` trains only
    each conversation's final assistant turn; the earlier ones are context.
    """

    learning_rate: _LearningRate | Annotated[list[_ScheduledRate], Field(min_length=1)] = 5e-5
    batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    assistant_turns: Literal["all", "last"] = "all"
    epochs: int = Field(1, ge=1, le=100)
    max_length: int | None = Field(None, ge=2)
    micro_batch_tokens: int = Field(2048, ge=16)
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    gradient_checkpointing: bool = False

    def resolved_batch_size(self) -> int:
        """Trajectories per batch (one optimizer step): "auto" is ART's LocalBackend's 2."""
        return SFT_AUTO_BATCH_SIZE if self.batch_size == "auto" else self.batch_size

    def batch_learning_rates(self, batches: int) -> list[float]:
        """The rate of each of `batches` batches; a schedule must have exactly one per batch."""
        if not isinstance(self.learning_rate, list):
            return [self.learning_rate] * batches
        if len(self.learning_rate) != batches:
            raise ValueError(
                f"learning_rate is a schedule of {len(self.learning_rate)} rates, but the "
                f"trajectories make {batches} batches (batch_size {self.resolved_batch_size()}, "
                f"epochs {self.epochs}): give one rate per batch, or a single rate."
            )
        return list(self.learning_rate)


class TrainResult(BaseModel):
    """What a training step did: the model's step after it, and the step's metrics."""

    # Read from the server, not written by a user: a newer server's extra fields are ignored.

    step: int
    metrics: dict[str, float] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    # Each trained trajectory's GRPO advantage, by trajectory id (0 in a zero-variance group).
    advantages: dict[str, float] = Field(default_factory=dict)
    # The new step's checkpoint folder on the backend's machine (ART's LocalTrainResult); None
    # when nothing was trained or with save_checkpoint=False.
    checkpoint_path: str | None = None
    # The step the plain name serves after this call: `step`, unless a promotion gate refused
    # it (None from a server that predates promotion).
    promoted_step: int | None = None

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
