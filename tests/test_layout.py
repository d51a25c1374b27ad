"""The house: wings whose arrows point one way, no import cycle, pinned public surfaces.

The import graph is read from the source (every `import`, type-only and function-level ones
included), so a cycle that only a type checker would follow still fails here.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.python_source import parse_file

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = {
    "art_core": ROOT / "art_core",
    "art_backend": ROOT / "backend" / "art_backend",
    "art_langgraph": ROOT / "integrations" / "langgraph" / "art_langgraph",
    "art_mcp": ROOT / "integrations" / "mcp" / "art_mcp",
    "art_ray": ROOT / "integrations" / "ray" / "art_ray",
}


def module_files() -> dict[str, Path]:
    """Every module of the four packages, by dotted name."""
    found = {}
    for package, folder in PACKAGE_FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (a `from pkg import name` of a submodule counts)."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(parse_file(path)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_anywhere_type_only_imports_included():
    assert cycles(import_graph()) == []


# wing -> the wings of the backend it may import (the package root: app, auth, errors, cli).
# Serving (the OpenAI protocol) and training stand side by side above the engines and the store.
WING_ARROWS = {
    "store": set(),
    "engines": set(),
    "serving": {"engines", "store"},
    "training": {"engines", "store"},
    "review": {"store"},
    # The Tinker API both trains and samples: above training and the engines.
    "tinker": {"engines", "store", "training"},
}


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "art_backend" and len(parts) > 2 else None


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80  # STYLE.md: split a room before it reaches these


def test_no_module_over_600_lines_and_no_function_over_80():
    """Mass under the limits: a module past 600 lines or a function past 80 is split by concept."""
    too_big = []
    for name, path in module_files().items():
        lines = path.read_text().count("\n")
        if lines > MAX_MODULE_LINES:
            too_big.append(f"module {name}: {lines} lines")
        for node in ast.walk(parse_file(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"function {name}.{node.name}: {length} lines")
    assert not too_big, too_big


def test_backend_wings_import_one_way():
    wrong = []
    for module, targets in import_graph().items():
        wing = wing_of(module)
        if wing is None:
            continue
        for target in targets:
            other = wing_of(target)
            if other is not None and other != wing and other not in WING_ARROWS[wing]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_packages_point_one_way():
    # integrations -> art_core; the backend may use art_core's name rule, its wire models and
    # the argument types every command line shares (art_core._arguments); art_core imports none.
    allowed = {
        "art_core": {"art_core"},
        "art_backend": {"art_backend", "art_core"},
        "art_langgraph": {"art_langgraph", "art_core"},
        "art_mcp": {"art_mcp", "art_core"},
        "art_ray": {"art_ray", "art_core"},
    }
    wrong = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        for target in targets
        if target.split(".")[0] not in allowed[module.split(".")[0]]
    ]
    assert wrong == []


@pytest.mark.parametrize(
    "modules",
    [
        "art_backend.store._checkpoints, art_backend.store._review_decisions",
        "art_backend.store._records",
        "art_backend.review.cli, art_backend.review._app",
        "art_backend.engines._engine",
        # What the backend and the integrations import from art_core stays light.
        "art_core, art_core.names, art_core.wire, art_core._arguments",
    ],
)
def test_torch_free_rooms_import_no_torch(modules):
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


PUBLIC_SURFACES = {
    "art_core": [
        "DEFAULT_RUBRIC", "ArtError", "AutoRLResult", "Backend", "BackendCrashedError",
        "BackendRequestError", "DatasetBatch", "GatheredGroups", "GeneratorContextError", "GeneratorError", "GroupSignal",
        "History",
        "InvalidTrajectoryError", "JudgeContextError", "JudgeError", "JudgeResponseError",
        "JudgeUnavailableError", "JudgeUsage", "LangfuseConfigError", "LangfuseExporter",
        "LangfuseNotInstalledError", "LoRAConfig", "LocalBackend", "Model", "ModelConfigError",
        "ModelNotRegisteredError", "NoTrajectoryError", "NotTrainableError", "RemoteBackend", "ResponseCache",
        "RolloutCapture", "RolloutException", "RulerScore", "Scenario", "ScenarioGenerationError",
        "StepObserver",
        "TokenPrice", "TooManyExceptionsError", "TrainConfig", "TrainResult", "TrainSFTConfig",
        "TrainableModel", "Trajectory", "TrajectoryGroup", "UnknownFieldError",
        "UnsupportedOptionError", "autorl", "flush_langfuse",
        "gather_trajectories", "gather_trajectory_groups", "generate_scenarios",
        "iterate_dataset", "judge_or_base_model", "langfuse_stats", "load_scenarios",
        "resolve_model", "retry", "ruler", "ruler_score_group", "save_scenarios",
        "split_scenarios", "trajectory_from_records",
        "current_trajectory", "no_capture", "trajectory", "trajectory_group",
        "PipelineRuntimeConfig", "PipelineTrainer",
        "PreflightError", "PreflightResult", "preflight",
        "PromotionGate", "PromotionGateError",
        "Messages", "MessagesAndChoices", "Tools", "limit_concurrency", "trajectory_group_batches",
        "dev",
    ],
    "art_core.dev": [
        "BackendModelConfig", "EngineArgs", "InitArgs", "InternalModelConfig", "LoRAConfig",
        "PeftArgs", "RolloutWeightUpdateMode", "TrainConfig", "TrainSFTConfig", "TrainerArgs",
        "IgnoredSettingWarning", "art_train_options", "model_settings", "train_config",
    ],
    "art_core.auto_trajectory": ["auto_trajectory", "capture_auto_trajectory"],
    "art_core.pipeline_trainer.trainer": ["PipelineTrainer", "make_group_rollout_fn"],
    "art_core.utils.litellm": ["convert_litellm_choice_to_openai"],
    "art_core.utils.output_dirs": [
        "get_default_art_path", "get_model_dir", "get_models_dir",
        "get_output_dir_from_model_properties", "get_step_checkpoint_dir", "get_trajectories_dir",
        "get_trajectories_split_dir",
    ],
    # ART's module paths: `from art.<module> import ...` ports by changing `art` to `art_core`.
    "art_core.model": ["Model", "RolloutCapture", "TrainableModel"],
    "art_core.trajectories": [
        "History", "Messages", "MessagesAndChoices", "RolloutException", "Tools", "Trajectory",
        "TrajectoryGroup",
    ],
    "art_core.gather": ["GatheredGroups", "gather_trajectories", "gather_trajectory_groups"],
    "art_core.backend": ["Backend", "RemoteBackend"],
    "art_core.batches": ["trajectory_group_batches"],
    "art_core.types": ["LoRAConfig", "TokenPrice", "TrainConfig", "TrainResult", "TrainSFTConfig"],
    "art_core.errors": [
        "ArtError", "BackendCrashedError", "BackendRequestError", "BackendWarning", "GeneratorContextError",
        "GeneratorError", "IgnoredSettingWarning", "InvalidSFTFileError", "InvalidTrajectoryError", "JudgeContextError",
        "JudgeError", "JudgeResponseError", "JudgeUnavailableError", "LangfuseConfigError",
        "LangfuseNotInstalledError", "ModelConfigError", "ModelNotRegisteredError",
        "NoTrajectoryError", "NotTrainableError", "PreflightError", "PromotionGateError",
        "ReviewReadError", "ScenarioGenerationError", "TooManyExceptionsError", "TrainingCommandError",
        "TrainingInputMismatchError",
        "UnknownFieldError", "UnsupportedOptionError",
    ],
    "art_core.local": ["LocalBackend"],
    # ART's modules of refused names only: they import, and hold nothing public of their own.
    "art_core.serverless": [],
    "art_core.serverless.backend": [],
    # ART's Tinker backends, training through an art-server's Tinker API (docs/tinker.md).
    "art_core.tinker": ["TinkerBackend"],
    "art_core.tinker_native": ["TinkerNativeBackend", "turn_datum"],
    "art_core.training": [
        "AdamConfig", "CheckpointRef", "CommandAdmission", "Contract", "ForwardBackwardRequest",
        "ForwardBackwardResult", "ForwardRequest", "ForwardResult", "LoadStateRequest",
        "LoadStateResult", "LocalInputStore", "LossConfig", "LossFnOutput", "OperationRef",
        "OptimStepRequest", "OptimStepResult", "PackingOutcome", "PolicyTokenCount",
        "RlTrajectoryBatch", "RunCommand", "RunCommandLedger", "SamplerPublication",
        "SamplerWeightsResult", "SaveStateRequest", "SaveStateResult",
        "SaveWeightsForSamplerRequest", "SupervisedTrajectoryBatch", "TrainingBatch",
        "TrainingClient", "TrainingInputObject", "TrainingInputObjectRef",
        "TrainingInputResolver", "TrainingOperation",
    ],
    "art_core.yield_trajectory": [],
    "art_core.wire": [
        "SEED_RANGE", "DeleteCheckpointsRequest", "ForkFrom", "GroupPayload", "HistoryPayload",
        "LogRequest", "PromoteRequest", "RegisterRequest", "SFTExample", "SFTRequest",
        "TrainRequest", "TrajectoryPayload", "TurnRef", "finite_reward",
    ],
    "art_core.trackers": [
        "DEFAULT_TRACKERS", "ENTRY_POINT_GROUP", "LogObserver", "observers_for", "tracker_links",
        "tracker_names",
    ],
    "art_core.trackers.wandb": ["WandbObserver", "wandb_installed", "wandb_tracker"],
    "art_core.trackers.trackio": ["TrackioObserver", "trackio_installed", "trackio_tracker"],
    "art_core.local.backend": ["LocalBackend"],
    "art_core.rewards": [
        "DEFAULT_RUBRIC", "AutoRLResult", "JudgeUsage", "PreflightError", "PreflightResult",
        "ResponseCache", "Rollout", "RulerScore", "RunOutcome", "RunSettings", "Scenario", "TrainingRun",
        "WarmStart", "autorl", "generate_scenarios", "group_scorer", "judge_answer",
        "judge_or_base_model", "load_scenarios", "preflight", "resolve_model", "ruler",
        "ruler_score_group", "save_scenarios", "split_scenarios",
    ],
    "art_core.rewards.ruler": ["DEFAULT_RUBRIC", "RulerScore", "ruler", "ruler_score_group"],
    "art_core.capture": [
        "NoTrajectoryError", "current_trajectory", "no_capture", "trajectory",
        "trajectory_from_records", "trajectory_group",
    ],
    "art_core.trackers.langfuse": [
        "LangfuseExporter", "LangfuseObserver", "LangfuseReview", "flush_langfuse",
        "langfuse_stats",
    ],
    "art_core.pipeline_trainer": [
        "CheckpointInfo", "CheckpointRetentionContext", "CheckpointRetentionStrategy", "EvalFn",
        "PipelineRuntimeConfig", "PipelineState", "PipelineTrainer", "RolloutExecutor", "RolloutFn", "ScenarioT",
        "SingleRolloutFn", "keep_recent_and_top", "make_group_rollout_fn",
    ],
    "art_core.utils": [
        "BatchGroups", "DatasetBatch", "GroupSignal", "carries_signal", "iterate_dataset",
        "jsonl_lines", "limit_concurrency", "retry", "scenario_hash",
    ],
    "art_core.utils.sft": [
        "InvalidSFTFileError", "SFTChunk", "create_lr_schedule", "create_sft_dataset_iterator",
        "get_file_row_count", "iterate_file", "resolve_sft_batch_size", "train_sft_from_file",
    ],
    "art_core.utils.deployment": [
        "DeploymentConfig", "DeploymentResult", "LoRADeploymentJob", "LoRADeploymentProvider",
        "Provider", "TogetherDeploymentConfig", "WandbDeploymentConfig", "deploy_model",
        "deploy_wandb",
    ],
    "art_core.names": [
        "ADAPTER_NAME_PATTERN", "DEFAULT_MODEL", "DEFAULT_MODEL_ALIAS", "NAME_PATTERN",
        "ROLLOUT_ID_PATTERN", "SERVED_NAME_PATTERN", "SPLIT_PATTERN", "base_model_aliases",
        "check_name", "check_split", "is_adapter_name", "is_default_model", "is_name",
        "is_rollout_id", "is_served_name", "is_split",
    ],
    "art_backend": [],
    "art_backend.cli": ["build_app", "main"],
    "art_backend.testing": [
        "BackendError", "CheckpointLoadError", "CompletionRecords", "GrammarCompiler",
        "InvalidGrammarError", "InvalidNameError", "InvalidRequestError", "LoadedModel",
        "LoraTrainer", "ModelLoadError", "ModelStore", "OptimizerSettings", "Rows", "Sequence",
        "TorchEngine", "TrainerStateError", "VllmProcess", "VllmSettings",
        "advantages_from_rewards", "cpu_supports_bf16", "ensure_default_model", "find_vllm_python",
        "list_pending", "load_model", "loss_preset", "pack_rows", "policy_loss",
        "read_trajectories", "read_trajectory_file", "resolve_device", "resolve_dtype",
        "stop_process_group", "write_pending",
    ],
    "art_langgraph": [
        "ModelNameMismatchError", "NoRolloutError", "TrainableChatModel", "current_rollout",
        "init_chat_model", "rollout", "wrap_rollout",
    ],
    "art_mcp": [
        "COMPLETE_TASK", "CheckedScenario", "GeneratedScenarioCollection", "McpConfigError", "McpContextError", "McpScenarioFileError", "McpScenarioToolsError", "McpServer",
        "McpServerError", "McpSession", "McpTool", "ToolNames", "ToolOutcome", "check_context", "describe_server",
        "generate_scenarios", "load_scenarios", "result_text", "rollout", "train",
    ],
    "art_ray": [
        "INFRASTRUCTURE_ERRORS", "ExecutorShutdownError", "ExecutorStats", "NoLiveWorkersError",
        "RayAuthenticationError", "RayClusterUnreachableError", "RayExecutor",
        "RolloutBlockedError", "RolloutExitError",
        "RolloutTimeoutError",
        "WorkerStartError",
    ],
    "art_ray.testing": ["LOOPBACK_ENV", "ROLLOUT_RESOURCES", "add_node", "kill_node", "local_cluster"],
}  # fmt: skip


@pytest.mark.parametrize("module_name", sorted(PUBLIC_SURFACES))
def test_public_surface_is_pinned(module_name):
    """Adding or removing a public name is a decision: change this list with it."""
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(PUBLIC_SURFACES[module_name])
    package = module_name.split(".")[0]
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith(package), f"{name} comes from {value.__module__}"
