"""ART 0.5.23 names this library does not implement: each imports, and using it raises
`UnsupportedOptionError` saying why and what to use instead.

A ported `from art.serverless import ServerlessBackend` then fails where it is used, with a
sentence, not with an ImportError at the top of the file. `REFUSED` is the one table of them, by
ART module; a module of ours serves its part through `module_getattr` (PEP 562, set by the
module itself or by `install()`), so the names stay out of `dir()` and `__all__`. Every ART
module in the table has ours: `art.X` is `art_core.X` (`art.serverless` and
`art.yield_trajectory` are modules of nothing else), and `art.mcp` is
`art_mcp`, which serves its own part (art_core never imports an integration).
`tests/compat/test_art_names.py` lists them in the compatibility page.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NoReturn

from art_core.errors import UnsupportedOptionError

_ENGINE = "our backend runs the engine itself (`art-server`, started by LocalBackend)"
_TOKENS = (
    "the server records the prompt and sampled token ids of every completion and trains on "
    "those, so a client never tokenizes or tensorizes trajectories"
)
_HOSTED = "OpenPipe's hosted service is not part of this library: use art.LocalBackend() or art.RemoteBackend(url)"
_TINKER_ARGS = (
    "TinkerBackend and TinkerNativeBackend take the model's LoRA settings (TrainableModel's "
    "lora=) and open the Tinker training run themselves; there are no Tinker client arguments"
)
_RENDERER = (
    "the server renders chats with the model's own chat template and records the exact tokens, "
    "so there is no renderer to pick; TinkerBackend and TinkerNativeBackend train through the "
    "Tinker API of an art-server, whose Chat Completions routes are the OpenAI-compatible server"
)
_MEGATRON = (
    "training is torch + PEFT LoRA in our backend; there is no Megatron runtime to configure"
)
_PIPELINE_METRICS = (
    "the pipeline trainer's metrics are in each step's TrainResult.metrics and the model's history"
)
_TUNER = "the pipeline trainer's settings are art_core.pipeline_trainer.PipelineRuntimeConfig; there is no autotuner"
_COMPACT = "trajectories are plain pydantic models here: use model_dump() / model_validate()"
_EXCHANGES = (
    "capture scopes record completions server-side (art_core.capture: art.trajectory(), "
    "art.trajectory_from_records()), not as client-side exchange objects"
)
_CAPTURE_YIELDED = (
    "use `await art.trajectory(coroutine)` (or `async with art.trajectory() as t:`), which "
    "captures the coroutine's completions into one Trajectory"
)
_YIELD = (
    "a rollout hands its Trajectory back by returning it; inside `art.trajectory()` it sets "
    "reward and metrics on art.current_trajectory(), and the conversation comes from the "
    "server's records"
)
_HISTORIES = (
    "a Trajectory's extra conversations are `additional_histories: list[art.History]`; "
    "the per-API history classes have no counterpart"
)

# ART module -> name -> why it is refused (what to use instead).
REFUSED: dict[str, dict[str, str]] = {
    "art": {
        "LocalTrainResult": "backend.train returns art.TrainResult (step, metrics, checkpoint_path)",
        "ServerlessTrainResult": _HOSTED,
        "LocalServingUnavailableError": f"{_ENGINE}; a dead engine raises art.BackendCrashedError",
        "MegatronRuntimeConfig": _MEGATRON,
        "MegatronTopologyConfig": _MEGATRON,
        "get_megatron_runtime_config": _MEGATRON,
        "init_megatron_runtime_config": _MEGATRON,
        "MetricDefinition": _PIPELINE_METRICS,
        "PIPELINE_RL_DASHBOARD_DEFAULT_METRICS": _PIPELINE_METRICS,
        "PIPELINE_RL_METRIC_DEFINITIONS": _PIPELINE_METRICS,
        "PIPELINE_RL_SCORE_METRICS": _PIPELINE_METRICS,
        "PipelineAutotuneConfig": _TUNER,
        "ServerlessBackend": _HOSTED,
        "get_tokenizer": f"{_TOKENS}; load a tokenizer with transformers.AutoTokenizer if you need one",
        "tokenize": _TOKENS,
        "tensorize": _TOKENS,
        # Served from art_core.yield_trajectory, as ART's __init__ imports them from its module.
        "capture_yielded_trajectory": _CAPTURE_YIELDED,
        "yield_trajectory": _YIELD,
    },
    "art.dev": {
        "TinkerArgs": _TINKER_ARGS,
        "TinkerNativeArgs": _TINKER_ARGS,
        "TinkerTrainingClientArgs": _TINKER_ARGS,
        "VllmRuntimeArgs": f"{_ENGINE}; an external vLLM is LocalBackend(extra_args=['--engine', 'vllm', '--vllm-url', URL])",
        "OpenAIServerConfig": f"{_ENGINE}; its options are LocalBackend(dtype=, device=, max_batch_size=, extra_args=)",
        "ServerArgs": f"{_ENGINE}; its options are LocalBackend(dtype=, device=, max_batch_size=, extra_args=)",
        "get_openai_server_config": f"{_ENGINE}; its options are LocalBackend(dtype=, device=, max_batch_size=, extra_args=)",
        "is_dedicated_mode": f"{_ENGINE}; trainer and engine placement is `art-server --trainer/--engine`",
        "is_external_vllm_mode": f"{_ENGINE}; an external vLLM is `art-server --engine vllm --vllm-url URL`",
        "validate_dedicated_config": f"{_ENGINE}; trainer and engine placement is `art-server --trainer/--engine`",
    },
    "art.utils": {
        "format_message": "print messages with art.Trajectory.messages() or your own formatter",
        "record_provenance": "each step's settings are recorded in the model's history by the backend",
        "log_http_errors": "backend errors raise art.BackendRequestError with the server's message",
        "get_model_step": "use `await model.get_step()` (or model.step after register/train)",
    },
    "art.pipeline_trainer": {
        "CHECKPOINT_CREATED_AT_METRIC": _PIPELINE_METRICS,
        "CHECKPOINT_EVAL_COMPLETED_METRIC": _PIPELINE_METRICS,
        "CHECKPOINT_SAVED_METRIC": _PIPELINE_METRICS,
        "PipelineAutotuneConfig": _TUNER,
        "StatusReporter": "PipelineTrainer logs its progress with the logging module and step metrics",
    },
    # Served by art_mcp (integrations/mcp); MCPTool, GeneratedScenario and complete_task_tool map.
    "art.mcp": {
        "MCPResource": (
            "art_mcp.McpServer.list_resources() returns the MCP SDK's mcp.types.Resource (.uri, "
            ".name, .description, .mime_type, as ART's class has them); read one with "
            "McpServer.read_resource(uri)"
        ),
    },
    "art.serverless": {"ServerlessBackend": _HOSTED},
    "art.adapter_leases": {
        "in_flight_lora_name": (
            "there is no in-flight LoRA here (weights swapped under a running rollout): every step "
            "is served immutably as <name>@<step>; pin a rollout to one with "
            "backend.adapter_lease(model, step)"
        ),
    },
    "art.yield_trajectory": {
        "capture_yielded_trajectory": _CAPTURE_YIELDED,
        "yield_trajectory": _YIELD,
    },
    "art.tinker": {"get_renderer_name": _RENDERER, "OpenAICompatibleTinkerServer": _RENDERER},
    "art.types": {
        "MegatronTopologyConfig": _MEGATRON,
        "MegatronRuntimeConfig": _MEGATRON,
        "SFTMetricLoggingConfig": "SFT steps' metrics are always recorded in the model's history",
        "Verbosity": "art_core logs with the logging module; set its level instead",
        "LocalTrainResult": "backend.train returns art.TrainResult (step, metrics, checkpoint_path)",
        "ServerlessTrainResult": _HOSTED,
    },
    "art.errors": {
        "LocalServingUnavailableError": f"{_ENGINE}; a dead engine raises art.BackendCrashedError",
        "ArtVllmMetricsTimeoutError": f"{_ENGINE}; engine metrics come in each step's TrainResult.metrics",
        "ForbiddenBucketCreationError": "checkpoints live in the backend's folder; there is no S3 upload",
        "UnsupportedLoRADeploymentProviderError": "the backend serves the adapters itself; there is no deployment step",
        "UnsupportedBaseModelDeploymentError": "the backend serves the adapters itself; there is no deployment step",
        "LoRADeploymentTimedOutError": "the backend serves the adapters itself; there is no deployment step",
    },
    "art.trajectories": {
        **dict.fromkeys(
            [
                "ChatCompletionsRequest", "CompletionsRequest", "ResponsesRequest",
                "MessagesRequest", "ChatCompletionsExchange", "CompletionsExchange",
                "ResponsesExchange", "MessagesExchange", "TrajectoryExchanges",
                "ChatCompletionsMessageSource", "AnthropicMessageSource", "ResponsesItemSource",
                "CompletionsSource", "CompletionsTokenSourceSpan", "CompletionsStringSourceSpan",
            ],
            _EXCHANGES,
        ),
        **dict.fromkeys(
            [
                "LegacyHistory", "ChatCompletionsHistory", "AnthropicMessagesHistory",
                "ResponsesHistory", "CompletionsTokenHistory", "CompletionsStringHistory",
                "TrajectoryHistory",
            ],
            _HISTORIES,
        ),
        **dict.fromkeys(
            [
                "TokenizedTrajectory", "TokenizedHistory", "TokenizedTopK",
                "TokenizedMultiHistoryTrajectory", "TokenizedTrajectoryGroup",
                "TensorizedHistory", "TensorizedTopK", "TensorizedMultiHistoryTrajectory",
                "TensorizedTrajectory", "TensorizedTrajectoryGroup", "Tokenizer", "TokenFlag",
                "tokenize", "tensorize", "first_occurrence_masks",
            ],
            _TOKENS,
        ),
        **dict.fromkeys(
            [
                "CompactDumpable", "CompactTrajectoryKind", "CompactTrajectoryPayload",
                "compact_memory", "compact_dump", "compact_validate", "compact_validate_json",
            ],
            _COMPACT,
        ),
        "PydanticException": "a failed rollout is art.RolloutException in a TrajectoryGroup's exceptions",
        "MetadataValue": "Trajectory.metadata takes any JSON value (dict[str, Any])",
    },
}  # fmt: skip


class RefusedName:
    """Stands for an ART name we do not implement: importing it works (and annotations that
    name it); calling it, or reading an attribute, raises `UnsupportedOptionError`."""

    def __init__(self, art_path: str, reason: str) -> None:
        self._art_path = art_path
        self._reason = reason

    @property
    def message(self) -> str:
        return f"{self._art_path} is not supported by art_core: {self._reason}."

    def _refuse(self) -> NoReturn:
        raise UnsupportedOptionError(self.message)

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()

    def __iter__(self) -> NoReturn:
        self._refuse()

    def __getitem__(self, item: Any) -> RefusedName:
        return self  # `TokenizedTrajectoryGroup[T]` in an annotation

    def __repr__(self) -> str:
        return f"<refused {self._art_path}>"


def refused(art_module: str, name: str) -> RefusedName | None:
    """The stand-in for ART's `art_module.name`, or None when that name is not refused."""
    reason = REFUSED.get(art_module, {}).get(name)
    return None if reason is None else RefusedName(f"{art_module}.{name}", reason)


# ART names that live at another path here, served at ART's path too (PEP 562, imported on
# first use: `art_core.types` must not import `art_core.trajectories` at load, nor
# `art_core.trajectories` the capture scopes, which import it). ART module -> name ->
# "our module:attribute". tests/compat/test_art_names.py lists them as mapped.
ALIASES: dict[str, dict[str, str]] = {
    "art.trajectories": {
        name: f"art_core.capture:{name}"
        for name in ("current_trajectory", "no_capture", "trajectory", "trajectory_group")
    },
    "art.types": {
        name: f"art_core.trajectories:{name}"
        for name in ("Message", "MessageOrChoice", "Messages", "MessagesAndChoices", "Tools")
    },
    "art.errors": {"ARTError": "art_core.errors:ArtError"},
}


def _alias(art_module: str, name: str) -> Any:
    module_name, _, attribute = ALIASES[art_module][name].partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def module_getattr(art_module: str, module_name: str) -> Callable[[str], Any]:
    """A module `__getattr__` serving `art_module`'s aliases and refused names (PEP 562)."""

    def __getattr__(name: str) -> Any:
        if name in ALIASES.get(art_module, {}):
            return _alias(art_module, name)
        stand_in = refused(art_module, name)
        if stand_in is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return stand_in

    return __getattr__


# Our modules that stand for an ART module whose refused names they serve. Their own files stay
# free of this: `install()` (called once by `art_core/__init__`) gives each a module
# `__getattr__`, unless it defines one itself.
SERVED_BY = {
    "art_core.trajectories": "art.trajectories",
    "art_core.types": "art.types",
    "art_core.utils": "art.utils",
    "art_core.pipeline_trainer": "art.pipeline_trainer",
    "art_core.errors": "art.errors",
    "art_core.adapter_leases": "art.adapter_leases",
}


def install() -> None:
    """Serve the refused names of `SERVED_BY`'s ART modules from ours (PEP 562)."""
    for module_name, art_module in SERVED_BY.items():
        module = importlib.import_module(module_name)
        if "__getattr__" not in vars(module):
            setattr(module, "__getattr__", module_getattr(art_module, module_name))  # noqa: B010


def integration_getattr(
    module_name: str, integration: str, extra: str, renamed: dict[str, str]
) -> Callable[[str], Any]:
    """A module `__getattr__` (PEP 562) re-exporting the integration package `integration`
    (`art_langgraph`, `art_mcp`) at ART's path, imported on first use (art_core itself imports
    no integration). `renamed`: ART's name -> "module:attribute" where it differs. A missing
    package or dependency raises ImportError naming the extra to install."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        target, _, attribute = renamed.get(name, f"{integration}:{name}").partition(":")
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise ImportError(
                f"{module_name}.{name} is {integration}'s, which needs the {extra!r} extra "
                f"({error}): pip install 'art-trainer[{extra}]'",
                name=module_name,
            ) from error
        try:
            return getattr(module, attribute)
        except AttributeError:
            raise AttributeError(
                f"module {module_name!r} has no attribute {name!r} (nor has {target})"
            ) from None

    return __getattr__
