"""ART main's `art.training`: Tinker's primitive for an ART model, on our training core.

ART's main branch (newer than the 0.5.23 this library ports) drives training as Tinker does:
`forward_backward` adds a batch's gradient, `optim_step` applies it, `save_weights_for_sampler`
publishes the step; every command has its place in the run's order and a reference; inputs may
be immutable stored objects. Here the same names train a registered `TrainableModel` through
its art-server's Tinker API (`TrainingClient.create(model)`), the server training with the one
core every route shares. docs/art-compatibility.md says what is ART main only and what
differs.
"""

from art_core.training.client import TrainingClient, TrainingOperation
from art_core.training.contracts import (
    AdamConfig,
    CheckpointRef,
    Contract,
    ForwardBackwardRequest,
    ForwardBackwardResult,
    ForwardRequest,
    ForwardResult,
    LoadStateRequest,
    LoadStateResult,
    LossConfig,
    LossFnOutput,
    OperationRef,
    OptimStepRequest,
    OptimStepResult,
    PackingOutcome,
    PolicyTokenCount,
    RlTrajectoryBatch,
    RunCommand,
    SamplerPublication,
    SamplerWeightsResult,
    SaveStateRequest,
    SaveStateResult,
    SaveWeightsForSamplerRequest,
    SupervisedTrajectoryBatch,
    TrainingBatch,
    TrainingInputObject,
    TrainingInputObjectRef,
)
from art_core.training.input_objects import LocalInputStore, TrainingInputResolver
from art_core.training.sequencing import CommandAdmission, RunCommandLedger

__all__ = [
    "AdamConfig",
    "CheckpointRef",
    "CommandAdmission",
    "Contract",
    "ForwardBackwardRequest",
    "ForwardBackwardResult",
    "ForwardRequest",
    "ForwardResult",
    "LoadStateRequest",
    "LoadStateResult",
    "LocalInputStore",
    "LossConfig",
    "LossFnOutput",
    "OperationRef",
    "OptimStepRequest",
    "OptimStepResult",
    "PackingOutcome",
    "PolicyTokenCount",
    "RlTrajectoryBatch",
    "RunCommand",
    "RunCommandLedger",
    "SamplerPublication",
    "SamplerWeightsResult",
    "SaveStateRequest",
    "SaveStateResult",
    "SaveWeightsForSamplerRequest",
    "SupervisedTrajectoryBatch",
    "TrainingBatch",
    "TrainingClient",
    "TrainingInputObject",
    "TrainingInputObjectRef",
    "TrainingInputResolver",
    "TrainingOperation",
]
