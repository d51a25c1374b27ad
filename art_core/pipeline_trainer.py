"""ART's `art.pipeline_trainer` module: `from art_core.pipeline_trainer import PipelineTrainer`.

The implementation lives in `art_core._pipeline`; this module only names its public parts.
"""

from art_core._pipeline import (
    CheckpointInfo,
    CheckpointRetentionContext,
    CheckpointRetentionStrategy,
    EvalFn,
    PipelineRuntimeConfig,
    PipelineState,
    PipelineTrainer,
    RolloutFn,
    ScenarioT,
    SingleRolloutFn,
    keep_recent_and_top,
    make_group_rollout_fn,
)

__all__ = [
    "CheckpointInfo",
    "CheckpointRetentionContext",
    "CheckpointRetentionStrategy",
    "EvalFn",
    "PipelineRuntimeConfig",
    "PipelineState",
    "PipelineTrainer",
    "RolloutFn",
    "ScenarioT",
    "SingleRolloutFn",
    "keep_recent_and_top",
    "make_group_rollout_fn",
]
