"""What tests, benchmarks and tools that drive the backend in-process may reach, in one place.

The backend's public surface is its HTTP API and its commands; code that runs it in-process
(the test suite, `benchmarks/`) needs a few of its parts as well: the error classes, the model
loader, the engine, the store's readers, the GRPO loss. They are named here, so that such code
depends on this list rather than on the wings' private modules (a unit test of one module's
internals still imports that module).
"""

from __future__ import annotations

from art_backend._errors import (
    BackendError,
    CheckpointLoadError,
    InvalidGrammarError,
    InvalidNameError,
    InvalidRequestError,
    ModelLoadError,
    TrainerStateError,
)
from art_backend.engines._constrained import GrammarCompiler
from art_backend.engines._loading import (
    LoadedModel,
    cpu_supports_bf16,
    ensure_default_model,
    load_model,
    resolve_device,
    resolve_dtype,
)
from art_backend.engines._torch_engine import TorchEngine
from art_backend.engines._vllm_process import (
    VllmProcess,
    VllmSettings,
    find_vllm_python,
    stop_process_group,
)
from art_backend.store._checkpoints import ModelStore, read_trajectories, read_trajectory_file
from art_backend.store._records import CompletionRecords
from art_backend.store._review_decisions import list_pending, write_pending
from art_backend.training._grpo import advantages_from_rewards, loss_preset, policy_loss
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._rows import Rows, Sequence, pack_rows
from art_backend.training._trainer import LoraTrainer

__all__ = [
    "BackendError",
    "CheckpointLoadError",
    "CompletionRecords",
    "GrammarCompiler",
    "InvalidGrammarError",
    "InvalidNameError",
    "InvalidRequestError",
    "LoadedModel",
    "LoraTrainer",
    "ModelLoadError",
    "ModelStore",
    "OptimizerSettings",
    "Rows",
    "Sequence",
    "TorchEngine",
    "TrainerStateError",
    "VllmProcess",
    "VllmSettings",
    "advantages_from_rewards",
    "cpu_supports_bf16",
    "ensure_default_model",
    "find_vllm_python",
    "list_pending",
    "load_model",
    "loss_preset",
    "pack_rows",
    "policy_loss",
    "read_trajectories",
    "read_trajectory_file",
    "resolve_device",
    "resolve_dtype",
    "stop_process_group",
    "write_pending",
]
