"""ART's `art.pipeline_trainer.trainer` path: the trainer is `_trainer.py`, `make_group_rollout_fn`
is with the rollout types in `_state.py`; these are their public names
(`from art_core.pipeline_trainer.trainer import PipelineTrainer`)."""

from art_core.pipeline_trainer._state import make_group_rollout_fn
from art_core.pipeline_trainer._trainer import PipelineTrainer

__all__ = ["PipelineTrainer", "make_group_rollout_fn"]
