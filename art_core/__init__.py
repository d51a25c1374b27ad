"""art_core: the client library of the agent reinforcement trainer (no torch import).

Names follow OpenPipe ART, so ART code ports by changing the import:

    import art_core as art
    model = art.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m-instruct")
    await model.register(art.LocalBackend(path=".art"))
"""

from art_core._backend import Backend, RemoteBackend
from art_core._config import LoRAConfig, TrainConfig, TrainResult, TrainSFTConfig
from art_core._errors import (
    ArtError,
    BackendCrashedError,
    BackendRequestError,
    InvalidTrajectoryError,
    ModelNotRegisteredError,
    NotTrainableError,
    TooManyExceptionsError,
)
from art_core._gather import gather_trajectories, gather_trajectory_groups
from art_core._local_backend import LocalBackend
from art_core._model import Model, RolloutCapture, TrainableModel, trajectory_from_records
from art_core._trajectory import History, RolloutException, Trajectory, TrajectoryGroup
from art_core._utils import DatasetBatch, iterate_dataset, retry

__all__ = [
    "ArtError",
    "Backend",
    "BackendCrashedError",
    "BackendRequestError",
    "DatasetBatch",
    "History",
    "InvalidTrajectoryError",
    "LoRAConfig",
    "LocalBackend",
    "Model",
    "ModelNotRegisteredError",
    "NotTrainableError",
    "RemoteBackend",
    "RolloutCapture",
    "RolloutException",
    "TooManyExceptionsError",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "gather_trajectories",
    "gather_trajectory_groups",
    "iterate_dataset",
    "retry",
    "trajectory_from_records",
]
