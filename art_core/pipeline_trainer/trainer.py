"""ART's `art.pipeline_trainer.trainer` path: the trainer is `_trainer.py`; these are its public
names (`from art_core.pipeline_trainer.trainer import PipelineTrainer`)."""

from art_core.pipeline_trainer._trainer import PipelineTrainer, make_group_rollout_fn

__all__ = ["PipelineTrainer", "make_group_rollout_fn"]
