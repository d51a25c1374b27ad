"""art_core: the client library of the agent reinforcement trainer (no torch import).

Names follow OpenPipe ART, so ART code ports by changing the import:

    import art_core as art
    model = art.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m-instruct")
    await model.register(art.LocalBackend(path=".art"))
"""

from art_core import utils as utils  # `art.utils.iterate_dataset`, as ART has it
from art_core._autorl import AutoRLResult, autorl
from art_core._backend import Backend, RemoteBackend
from art_core._batches import trajectory_group_batches
from art_core._cache import ResponseCache
from art_core._capture import (
    NoTrajectoryError,
    current_trajectory,
    no_capture,
    trajectory,
    trajectory_group,
)
from art_core._config import LoRAConfig, TokenPrice, TrainConfig, TrainResult, TrainSFTConfig
from art_core._errors import (
    ArtError,
    BackendCrashedError,
    BackendRequestError,
    GeneratorContextError,
    GeneratorError,
    InvalidTrajectoryError,
    JudgeContextError,
    JudgeError,
    JudgeResponseError,
    JudgeUnavailableError,
    LangfuseConfigError,
    LangfuseNotInstalledError,
    ModelConfigError,
    ModelNotRegisteredError,
    NotTrainableError,
    ScenarioGenerationError,
    TooManyExceptionsError,
    UnknownFieldError,
    UnsupportedOptionError,
)
from art_core._gather import GatheredGroups, gather_trajectories, gather_trajectory_groups
from art_core._langfuse import LangfuseExporter, flush_langfuse, langfuse_stats
from art_core._local_backend import LocalBackend
from art_core._model import Model, RolloutCapture, TrainableModel
from art_core._observers import StepObserver
from art_core._pipeline import PipelineTrainer
from art_core._preflight import PreflightError, PreflightResult, preflight
from art_core._rollout import trajectory_from_records
from art_core._ruler import RulerScore, ruler, ruler_score_group
from art_core._ruler_prompt import DEFAULT_RUBRIC
from art_core._scenarios import (
    Scenario,
    generate_scenarios,
    load_scenarios,
    save_scenarios,
    split_scenarios,
)
from art_core._structured import JudgeUsage, judge_or_base_model, resolve_model
from art_core._trajectory import (
    History,
    Messages,
    MessagesAndChoices,
    RolloutException,
    Tools,
    Trajectory,
    TrajectoryGroup,
)
from art_core._utils import DatasetBatch, iterate_dataset, limit_concurrency, retry

__all__ = [
    "DEFAULT_RUBRIC",
    "ArtError",
    "AutoRLResult",
    "Backend",
    "BackendCrashedError",
    "BackendRequestError",
    "DatasetBatch",
    "GatheredGroups",
    "GeneratorContextError",
    "GeneratorError",
    "History",
    "InvalidTrajectoryError",
    "JudgeContextError",
    "JudgeError",
    "JudgeResponseError",
    "JudgeUnavailableError",
    "JudgeUsage",
    "LangfuseConfigError",
    "LangfuseExporter",
    "LangfuseNotInstalledError",
    "LoRAConfig",
    "LocalBackend",
    "Messages",
    "MessagesAndChoices",
    "Model",
    "ModelConfigError",
    "ModelNotRegisteredError",
    "NoTrajectoryError",
    "NotTrainableError",
    "PipelineTrainer",
    "PreflightError",
    "PreflightResult",
    "RemoteBackend",
    "ResponseCache",
    "RolloutCapture",
    "RolloutException",
    "RulerScore",
    "Scenario",
    "ScenarioGenerationError",
    "StepObserver",
    "TokenPrice",
    "TooManyExceptionsError",
    "Tools",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "UnknownFieldError",
    "UnsupportedOptionError",
    "autorl",
    "current_trajectory",
    "flush_langfuse",
    "gather_trajectories",
    "gather_trajectory_groups",
    "generate_scenarios",
    "iterate_dataset",
    "judge_or_base_model",
    "langfuse_stats",
    "limit_concurrency",
    "load_scenarios",
    "no_capture",
    "preflight",
    "resolve_model",
    "retry",
    "ruler",
    "ruler_score_group",
    "save_scenarios",
    "split_scenarios",
    "trajectory",
    "trajectory_from_records",
    "trajectory_group",
    "trajectory_group_batches",
]
