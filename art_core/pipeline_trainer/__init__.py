"""ART's `art.pipeline_trainer`: rollout workers keep sampling while the trainer trains
(`from art_core.pipeline_trainer import PipelineTrainer`).

The trainer is `_trainer.py`, its settings `_settings.py`, its state `_state.py`, checkpoint
retention `_retention.py`; this module names their public parts.
"""

from art_core.pipeline_trainer._retention import (
    CheckpointInfo,
    CheckpointRetentionContext,
    CheckpointRetentionStrategy,
    keep_recent_and_top,
)
from art_core.pipeline_trainer._settings import PipelineRuntimeConfig
from art_core.pipeline_trainer._state import (
    EvalFn,
    PipelineState,
    RolloutExecutor,
    RolloutFn,
    ScenarioT,
    SingleRolloutFn,
    make_group_rollout_fn,
)
from art_core.pipeline_trainer._trainer import PipelineTrainer

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
