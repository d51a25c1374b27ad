"""ART's `art.pipeline_trainer` module: `from art_core.pipeline_trainer import PipelineTrainer`.

The implementation lives in `art_core._pipeline` (retention in `art_core._retention`); this module only names its public parts.
"""

from art_core._pipeline import (
    EvalFn,
    PipelineRuntimeConfig,
    PipelineState,
    PipelineTrainer,
    RolloutFn,
    ScenarioT,
    SingleRolloutFn,
    make_group_rollout_fn,
)
from art_core._retention import (
    CheckpointInfo,
    CheckpointRetentionContext,
    CheckpointRetentionStrategy,
    keep_recent_and_top,
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
