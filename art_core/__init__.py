"""art_core: the client library of the agent reinforcement trainer (no torch import).

Names follow OpenPipe ART, so ART code ports by changing the import:

    import art_core as art
    model = art.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m-instruct")
    await model.register(art.LocalBackend(path=".art"))

The map (ART's module paths where ART has the concept: `from art.X import ...` ports as
`from art_core.X import ...`):

    model, trajectories, gather, batches, backend, types, errors   the core: models, runs and
                          groups, rollouts gathered, the Backend protocol and RemoteBackend,
                          settings and results, the error hierarchy
    wire                  the training API's requests, one definition for client and server
    names                 the name rules both sides share
    local/                LocalBackend: the backend in a child process
    dev                   ART's developer settings (art.dev), honoured or refused with a note
    auto_trajectory       ART's old capture names, over capture/
    capture/              capture scopes: completions made inside `art.trajectory()`
    rewards/              RULER, generated scenarios, AutoRL, preflight, one run loop
    pipeline_trainer/     asynchronous pipeline training
    trackers/             step observers named by `report_metrics` (Langfuse in langfuse/)
    utils/                dataset batches, retries, concurrency, one JSONL reader, SFT files
    report, cli           the demo's report; the `art` command
    serverless, tinker, tinker_native, yield_trajectory
                          ART's modules we do not implement: their names import and refuse

ART 0.5.23's names we do not implement import, and raise UnsupportedOptionError saying what to
use when used (`_refused_art_names.py`); docs/art-compatibility.md lists every ART name.
"""

from art_core import _refused_art_names
from art_core import dev as dev  # `art.dev.InternalModelConfig`, as ART has it
from art_core import utils as utils  # `art.utils.iterate_dataset`, as ART has it
from art_core._observers import StepObserver
from art_core._promotion import PromotionGate
from art_core.backend import Backend, RemoteBackend
from art_core.batches import trajectory_group_batches
from art_core.capture import (
    NoTrajectoryError,
    current_trajectory,
    no_capture,
    trajectory,
    trajectory_from_records,
    trajectory_group,
)
from art_core.errors import (
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
    PromotionGateError,
    ScenarioGenerationError,
    TooManyExceptionsError,
    UnknownFieldError,
    UnsupportedOptionError,
)
from art_core.gather import GatheredGroups, gather_trajectories, gather_trajectory_groups
from art_core.local import LocalBackend
from art_core.model import Model, RolloutCapture, TrainableModel
from art_core.pipeline_trainer import PipelineRuntimeConfig, PipelineTrainer
from art_core.rewards import (
    DEFAULT_RUBRIC,
    AutoRLResult,
    JudgeUsage,
    PreflightError,
    PreflightResult,
    ResponseCache,
    RulerScore,
    Scenario,
    autorl,
    generate_scenarios,
    judge_or_base_model,
    load_scenarios,
    preflight,
    resolve_model,
    ruler,
    ruler_score_group,
    save_scenarios,
    split_scenarios,
)
from art_core.trackers.langfuse import LangfuseExporter, flush_langfuse, langfuse_stats
from art_core.trajectories import (
    History,
    Messages,
    MessagesAndChoices,
    RolloutException,
    Tools,
    Trajectory,
    TrajectoryGroup,
)
from art_core.types import LoRAConfig, TokenPrice, TrainConfig, TrainResult, TrainSFTConfig
from art_core.utils import DatasetBatch, GroupSignal, iterate_dataset, limit_concurrency, retry

# As ART's __init__ does: once art_core.yield_trajectory (a module) is loaded, `art.yield_trajectory`
# stays the (refused) function, as it is in ART. Not in __all__, like every refused name.
from art_core.yield_trajectory import capture_yielded_trajectory as capture_yielded_trajectory
from art_core.yield_trajectory import yield_trajectory as yield_trajectory

# ART before 0.5 (deprecated there and here): `art.auto_trajectory()` is the function, as in ART.
from art_core.auto_trajectory import auto_trajectory as auto_trajectory  # isort: skip
from art_core.auto_trajectory import capture_auto_trajectory as capture_auto_trajectory

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
    "GroupSignal",
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
    "PipelineRuntimeConfig",
    "PipelineTrainer",
    "PreflightError",
    "PreflightResult",
    "PromotionGate",
    "PromotionGateError",
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
    "dev",
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

# ART's names we refuse, with a reason; and those of art.trajectories, art.types, ... from our
# modules of that name.
__getattr__ = _refused_art_names.module_getattr("art", __name__)
_refused_art_names.install()
