"""PipelineTrainer's settings: ART's keywords, checked once and held as one frozen object.

`PipelineSettings.from_keywords` takes the keywords `PipelineTrainer(...)` was given (ART's
names), refuses the ones ART has and this trainer does not (naming what to use instead), checks
the ranges, and resolves what ART derives:

    max_batch_size   None -> 10 x min_batch_size
    queue_maxsize    None -> max(1, max_steps_off_policy x max_batch_size)  (1 step's worth
                             when there is no bound)
    train_config     train_config (ours) with learning_rate, loss_fn, normalize_advantages on
                     top; what neither sets: learning_rate 1e-5, loss "cispo" (ART's defaults)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from art_core._promotion import PromotionGate
from art_core._unknown_fields import StrictModel, check_names
from art_core.pipeline_trainer._retention import CheckpointRetentionStrategy
from art_core.types import TrainConfig
from art_core.utils._signal import GroupSignal
from art_core.wire import MAX_SERVED_STEPS

# ART's PipelineTrainer keywords this trainer does not have, and what to use instead.
UNSUPPORTED_HINTS = {
    "autotune": "Pipeline autotuning is not implemented: set the pipeline sizes yourself.",
    "loss_fn_config": "Pass our TrainConfig fields as train_config=art.TrainConfig(...).",
    "kl_penalty_coef": "Our KL term is to the base model: train_config=art.TrainConfig(beta=...).",
    "save_checkpoint": "Every step is a checkpoint here (served as <name>@<step>).",
    "resume": "train() always resumes from the model's current step on the backend.",
    "limit_mean_steps_off_policy": "Use max_steps_off_policy (a strict bound).",
}
UNSUPPORTED_HINT = (
    "ART's {name!r} has no counterpart in art_core's PipelineTrainer (see its docstring)."
)

KNOWN_KEYWORDS = [
    "num_rollout_workers", "min_batch_size", "max_batch_size", "queue_maxsize", "pipeline",
    "learning_rate", "loss_fn", "normalize_advantages", "train_config", "max_steps",
    "discard_queue_multiplier", "max_steps_off_policy", "eval_every_n_steps", "eval_at_start",
    "checkpoint_retention_strategy", "checkpoint_retention_interval", "executor", "promote_if",
    "signal",
]  # fmt: skip

# The keywords that must be at least this much when given.
_LOWEST = {
    "max_steps": 0,
    "max_steps_off_policy": 0,
    "eval_every_n_steps": 0,
    "discard_queue_multiplier": 1,
    "checkpoint_retention_interval": 1,
}


class PipelineRuntimeConfig(StrictModel):
    """How many rollout workers run, how many groups a step trains, and the queue's bound.

    `max_batch_size` None: 10 x `min_batch_size` (ART's default). `queue_maxsize` None:
    `max(1, max_steps_off_policy x max_batch_size)` (1 step's worth with no bound), as ART.
    """

    num_rollout_workers: int = Field(16, ge=1)
    min_batch_size: int = Field(4, ge=1)
    max_batch_size: int | None = Field(None, ge=1)
    queue_maxsize: int | None = Field(None, ge=1)


@dataclass(frozen=True)
class PipelineSettings:
    """What a PipelineTrainer was set to, resolved: its sizes, every step's TrainConfig, when it
    stops, evaluates and prunes checkpoints, the promotion gate and the group signal."""

    pipeline: PipelineRuntimeConfig  # the sizes as given (pipeline=, or ART's keywords)
    num_rollout_workers: int
    min_batch_size: int
    max_batch_size: int
    queue_maxsize: int
    train_config: TrainConfig
    max_steps: int | None
    discard_queue_multiplier: int
    max_steps_off_policy: int | None
    eval_every_n_steps: int
    eval_at_start: bool
    checkpoint_retention_strategy: CheckpointRetentionStrategy | None
    checkpoint_retention_interval: int
    promote_if: PromotionGate | None
    signal: GroupSignal | None

    @classmethod
    def from_keywords(cls, unsupported: Mapping[str, Any], **given: Any) -> PipelineSettings:
        """The settings `PipelineTrainer(**given)` asks for; `unsupported`: the keywords it does
        not know (UnknownFieldError, naming the closest or what to use instead)."""
        hints = {
            name: UNSUPPORTED_HINTS.get(name, UNSUPPORTED_HINT.format(name=name))
            for name in unsupported
        }
        check_names("PipelineTrainer()", unsupported, KNOWN_KEYWORDS, hints=hints)
        sizes = _pipeline_sizes(
            given.pop("pipeline"),
            **{name: given.pop(name) for name in PipelineRuntimeConfig.model_fields},
        )
        for name, low in _LOWEST.items():
            if given[name] is not None and given[name] < low:
                raise ValueError(f"{name} must be >= {low}, got {given[name]}")
        _check_kind("promote_if", given["promote_if"], PromotionGate, "art.PromotionGate")
        _check_kind("signal", given["signal"], GroupSignal, "art.GroupSignal")
        max_batch_size = sizes.max_batch_size or 10 * sizes.min_batch_size
        off_policy = given["max_steps_off_policy"]
        window = 1 if off_policy is None else off_policy
        train_config = step_train_config(
            given.pop("train_config"),
            given.pop("learning_rate"),
            given.pop("loss_fn"),
            given.pop("normalize_advantages"),
        )
        return cls(
            pipeline=sizes,
            num_rollout_workers=sizes.num_rollout_workers,
            min_batch_size=sizes.min_batch_size,
            max_batch_size=max_batch_size,
            queue_maxsize=sizes.queue_maxsize or max(1, window * max_batch_size),
            train_config=train_config,
            **given,
        )

    @property
    def served_window(self) -> int:
        """How many steps behind the current one a running rollout may be sampling."""
        if self.max_steps_off_policy is None:
            return MAX_SERVED_STEPS - 1
        return min(self.max_steps_off_policy, MAX_SERVED_STEPS - 1)


def _pipeline_sizes(
    pipeline: PipelineRuntimeConfig | None, **direct_or_none: int | None
) -> PipelineRuntimeConfig:
    """The pipeline's sizes, given as `pipeline=` or as ART's keywords (not both)."""
    direct = {key: value for key, value in direct_or_none.items() if value is not None}
    if pipeline is not None and direct:
        raise ValueError(
            "Pass the pipeline sizes either as pipeline=PipelineRuntimeConfig(...) or as "
            f"keywords, not both (got pipeline= and {', '.join(direct)})."
        )
    pipeline = pipeline or PipelineRuntimeConfig(**direct)
    if pipeline.max_batch_size is not None and pipeline.max_batch_size < pipeline.min_batch_size:
        raise ValueError("max_batch_size must be >= min_batch_size")
    return pipeline


def _check_kind(name: str, value: Any, kind: type, spelled: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise TypeError(
            f"PipelineTrainer(): {name} must be an {spelled}, got {type(value).__name__}"
        )


def step_train_config(
    base: TrainConfig | None,
    learning_rate: float | None,
    loss_fn: str | None,
    normalize_advantages: bool,
) -> TrainConfig:
    """The TrainConfig of every step: `base` (ours) with ART's keywords on top.

    What neither sets takes ART's PipelineTrainer defaults: learning_rate 1e-5, loss_fn "cispo".
    `loss_fn` is ART's "cispo" or "ppo", or one of our presets; TrainConfig validates it.
    """
    fields = base.model_dump(exclude_unset=True) if base is not None else {}
    if learning_rate is not None or "learning_rate" not in fields:
        fields["learning_rate"] = 1e-5 if learning_rate is None else learning_rate
    if loss_fn is not None or "loss" not in fields:
        fields["loss"] = loss_fn or "cispo"
    if not normalize_advantages:
        fields["scale_rewards"] = "none"
    return TrainConfig(**fields)
