"""ART's `art.pipeline_trainer`: rollout workers keep sampling while the trainer trains
(`from art_core.pipeline_trainer import PipelineTrainer`).

The trainer is `_trainer.py`, its settings and state `_state.py`, checkpoint retention
`_retention.py`; this module names their public parts.
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
    RolloutExecutor,
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
    "RolloutExecutor",
    "RolloutFn",
    "ScenarioT",
    "SingleRolloutFn",
    "keep_recent_and_top",
    "make_group_rollout_fn",
]
