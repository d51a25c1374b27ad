"""ART's `art.pipeline_trainer` module: `from art_core.pipeline_trainer import PipelineTrainer`.

The implementation lives in `art_core.pipeline_trainer._trainer` (settings and state in `art_core.pipeline_trainer._state`,
retention in `art_core.pipeline_trainer._retention`); this module only names its public parts.
"""

from art_core.pipeline_trainer._retention import (
    CheckpointInfo,
    CheckpointRetentionContext,
    CheckpointRetentionStrategy,
    keep_recent_and_top,
)
from art_core.pipeline_trainer._state import (
    EvalFn,
    PipelineRuntimeConfig,
    PipelineState,
    RolloutFn,
    ScenarioT,
    SingleRolloutFn,
)
from art_core.pipeline_trainer._trainer import PipelineTrainer, make_group_rollout_fn

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
