"""ART's `art.dev`: its developer settings, as the typed dicts ART code writes, mapped onto ours.

    model = art.TrainableModel(
        name="agent", base_model="...",
        _internal_config=art.dev.InternalModelConfig(
            init_args=art.dev.InitArgs(dtype="float32"),
            engine_args=art.dev.EngineArgs(max_num_seqs=16),
        ),
    )
    model._internal_config = ...                 # after construction: the same (ART's 2048)

Every key is honoured, ignored with a warning, or refused (`UnsupportedOptionError` naming what
to use here); docs/art-compatibility.md lists them:

    InternalModelConfig / BackendModelConfig     (TrainableModel(_internal_config=...))
      lora_config: rank, alpha, dropout,         TrainableModel(lora_config=...)
        target_modules
      init_args.dtype, engine_args.dtype         LocalBackend(dtype=...), when it is "auto"
      engine_args.max_num_seqs                   LocalBackend(max_batch_size=...), when default
      init_args.max_seq_length,                  the model's default TrainConfig(max_length=...):
        engine_args.max_model_len                longer rows are dropped from training, counted
      init_args.load_in_4bit / load_in_8bit:     False: ignored with a warning (the backend
        False, load_in_16bit                     never quantizes); True for 4 or 8 bits refused
      placement and memory hints                 ignored, with an `IgnoredSettingWarning`
        (gpu_memory_utilization, trainer_gpu_ids, (`PLACEMENT_KEYS`): art-server places and
        inference_gpu_ids, enforce_eager, ...)   sizes the engine itself
    TrainConfig (ART's `_config` of model.train  the TrainConfig fields of the same name;
      and backend.train)                         ppo=True: loss="ppo"; scale_rewards: bool;
                                                 packed_sequence_length: max_length;
                                                 logprob_calculation_chunk_size: no effect
                                                 (warned): micro_batch_tokens bounds memory
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from art_core._caller_warnings import warn_at_caller
from art_core._refused_art_names import module_getattr
from art_core.errors import IgnoredSettingWarning, UnsupportedOptionError
from art_core.types import _ONLY_DEFAULT, ART_TRAIN_DEFAULTS
from art_core.types import TrainConfig as _TrainConfig

__all__ = [
    "BackendModelConfig",
    "EngineArgs",
    "IgnoredSettingWarning",
    "InitArgs",
    "InternalModelConfig",
    "LoRAConfig",
    "PeftArgs",
    "RolloutWeightUpdateMode",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "art_train_options",
    "model_settings",
    "train_config",
]

RolloutWeightUpdateMode = Literal["step_lora", "in_flight_lora"]


class InitArgs(TypedDict, total=False):
    """ART's model-loading arguments: `dtype` and `max_seq_length` are honoured."""

    dtype: str | None
    max_seq_length: int
    gpu_memory_utilization: float
    load_in_4bit: bool
    load_in_8bit: bool
    load_in_16bit: bool


class EngineArgs(TypedDict, total=False):
    """ART's vLLM engine arguments: `dtype`, `max_num_seqs` and `max_model_len` are honoured."""

    dtype: str
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    enforce_eager: bool
    num_scheduler_steps: int


class LoRAConfig(TypedDict, total=False):
    """ART's LoRA settings (`rank` is our `r`)."""

    rank: int
    alpha: int
    dropout: float
    target_modules: list[str]


PeftArgs = LoRAConfig  # ART's PEFT arguments carry the same LoRA settings


class TrainerArgs(TypedDict, total=False):
    """ART's Hugging Face trainer arguments: none are model settings here (see `model_settings`)."""

    learning_rate: float
    max_grad_norm: float
    weight_decay: float


class InternalModelConfig(TypedDict, total=False):
    """ART's `TrainableModel(_internal_config=...)`."""

    init_args: InitArgs
    engine_args: EngineArgs
    trainer_args: TrainerArgs
    lora_config: LoRAConfig
    peft_args: PeftArgs
    trainer_gpu_ids: list[int]
    inference_gpu_ids: list[int]
    # ART's key, so ART's configs build; a model given one refuses it by name (_SECTION_NOTES).
    tinker_args: Mapping[str, object]


BackendModelConfig = InternalModelConfig


class TrainConfig(TypedDict, total=False):
    """ART's `model.train(..., _config=...)` experimental options (see `train_config`)."""

    advantage_balance: float
    allow_training_without_logprobs: bool
    epsilon: float
    epsilon_high: float | None
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"]
    kl_penalty_coef: float
    kl_penalty_source: Literal["current_learner", "sample"]
    kimi_k2_tau: float | None
    logprob_calculation_chunk_size: int
    mask_prob_ratio: bool
    max_negative_advantage_importance_sampling_weight: float
    num_trajectories_learning_rate_multiplier_power: float
    packed_sequence_length: int | None
    ppo: bool
    precalculate_logprobs: bool
    scale_rewards: bool
    truncated_importance_sampling: float | None


class TrainSFTConfig(TypedDict, total=False):
    """ART's `train_sft(_config=...)`: no key is honoured (our SFT settings are art.TrainSFTConfig)."""


_ENGINE_NOTE = (
    "our backend runs its own engine: its settings are LocalBackend(dtype=, device=, "
    "max_batch_size=, extra_args=[...art-server options])"
)
_TRAINER_NOTE = "training settings are per step here: backend.train(model, groups, learning_rate=...) or art.TrainConfig"
_TINKER_NOTE = (
    "TinkerBackend and TinkerNativeBackend open the Tinker training run with the model's lora= "
    "(the renderer is the model's own chat template)"
)
_LORA_KEYS = {
    "rank": "r",
    "alpha": "alpha",
    "dropout": "dropout",
    "target_modules": "target_modules",
}
_SECTION_NOTES = {
    "trainer_args": _TRAINER_NOTE,
    "tinker_args": _TINKER_NOTE,
    "tinker_native_args": _TINKER_NOTE,
    "vllm_runtime": "an external vLLM is LocalBackend(extra_args=['--engine', 'vllm', '--vllm-url', URL])",
    "rollout_weights_mode": "the engine serves each step's LoRA adapter as it is ('lora')",
    "rollout_weight_update_mode": "each step is served as an adapter of its own ('step_lora')",
}
_DEVICES = (
    "art-server places the engine and the trainer itself (one device by default; vLLM on a GPU "
    "of its own: LocalBackend(extra_args=['--vllm-devices', '1']), or CUDA_VISIBLE_DEVICES)"
)
_SIZES = (
    "art-server sizes and tunes the engine itself; to hand it to vLLM anyway: "
    "LocalBackend(extra_args=['--vllm-arg=--{flag}={value}'])"
)
_CHECKPOINTING = (
    "gradient checkpointing is per step here: art.TrainConfig(gradient_checkpointing=True)"
)
# Keys that say where the work runs, or how fast and in how much memory, never what is computed:
# ignored, with an IgnoredSettingWarning saying why (section -> key -> why; "" for top level).
PLACEMENT_KEYS: dict[str, dict[str, str]] = {
    "": {"trainer_gpu_ids": _DEVICES, "inference_gpu_ids": _DEVICES},
    "init_args": {
        **dict.fromkeys(
            ["gpu_memory_utilization", "fast_inference", "disable_log_stats",
             "enable_prefix_caching", "use_async", "max_lora_rank"],
            _SIZES,
        ),
        "device_map": _DEVICES,
        "use_gradient_checkpointing": _CHECKPOINTING,
    },
    "engine_args": {
        **dict.fromkeys(
            ["gpu_memory_utilization", "enforce_eager", "num_scheduler_steps", "swap_space",
             "cpu_offload_gb", "block_size", "enable_prefix_caching", "max_num_batched_tokens",
             "enable_chunked_prefill", "disable_log_stats", "disable_log_requests",
             "enable_sleep_mode", "max_seq_len_to_capture", "num_gpu_blocks_override",
             "max_parallel_loading_workers", "disable_custom_all_reduce", "max_cpu_loras",
             "max_loras", "max_lora_rank", "preemption_mode", "scheduler_delay_factor",
             "multi_step_stream_outputs", "disable_async_output_proc", "scheduling_policy",
             "max_num_partial_prefills", "max_long_partial_prefills",
             "long_prefill_token_threshold", "tokenizer_pool_size", "download_dir"],
            _SIZES,
        ),
        **dict.fromkeys(
            ["tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend",
             "device"],
            _DEVICES,
        ),
    },
}  # fmt: skip
# Unsloth's loading precision. This backend never quantizes: LoRA trains on the base weights as
# loaded, in LocalBackend's dtype. init_args key -> whether True asks for quantized weights.
_PRECISION = (
    "this backend never quantizes; LoRA trains on the base weights in LocalBackend's dtype "
    "(auto: bfloat16 on a GPU with native bf16, else float32; set it with "
    "LocalBackend(dtype=...) or init_args.dtype)"
)
_LOAD_PRECISION = {"load_in_4bit": True, "load_in_8bit": True, "load_in_16bit": False}
_LENGTH_KEYS = ("max_seq_length", "max_model_len")
# ART's modes whose value is what this backend does (one LoRA adapter served per step).
_OURS = {"rollout_weights_mode": "lora", "rollout_weight_update_mode": "step_lora"}


def _refuse(path: str, note: str) -> UnsupportedOptionError:
    return UnsupportedOptionError(f"art.dev {path} is not honoured here: {note}.")


def _ignore(path: str, value: Any, why: str) -> None:
    """Warn, pointing at the caller's line outside art_core."""
    flag = path.rpartition(".")[2].replace("_", "-")
    why = why.replace("{flag}", flag).replace("{value}", str(value))
    warn_at_caller(f"art.dev {path}={value!r} is ignored here: {why}.", IgnoredSettingWarning)


def model_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """ART's InternalModelConfig as our settings: `lora` (LoRAConfig fields), `dtype`,
    `max_batch_size` (LocalBackend's), `max_length` (the model's default TrainConfig.max_length).
    Placement hints warn (IgnoredSettingWarning); any other key raises UnsupportedOptionError."""
    settings: dict[str, Any] = {}
    for section, value in config.items():
        if section in ("lora_config", "peft_args"):
            lora = settings.setdefault("lora", {})
            for key, item in dict(value).items():
                if key not in _LORA_KEYS:
                    raise _refuse(
                        f"{section}.{key}",
                        "the LoRA settings here are rank, alpha, dropout, target_modules",
                    )
                lora[_LORA_KEYS[key]] = item
        elif section in ("init_args", "engine_args"):
            for key, item in dict(value).items():
                _engine_setting(settings, section, key, item)
        elif section in PLACEMENT_KEYS[""]:
            _ignore(section, value, PLACEMENT_KEYS[""][section])
        elif _OURS.get(section) == value:
            continue  # what this backend does anyway
        else:
            raise _refuse(section, _SECTION_NOTES.get(section, _ENGINE_NOTE))
    return settings


def _engine_setting(settings: dict[str, Any], section: str, key: str, item: Any) -> None:
    """One key of init_args / engine_args into `settings` (or warned, or refused)."""
    if key == "dtype":
        if item is not None:
            settings["dtype"] = item
    elif key == "max_num_seqs" and section == "engine_args":
        settings["max_batch_size"] = int(item)
    elif key in _LENGTH_KEYS:
        length = int(item)
        if settings.get("max_length", length) != length:
            raise _refuse(
                f"{section}.{key}",
                f"init_args.max_seq_length and engine_args.max_model_len are one setting here "
                f"(the longest row trained): give one value, not {settings['max_length']} and {length}",
            )
        settings["max_length"] = length
    elif section == "init_args" and key in _LOAD_PRECISION:
        if item and _LOAD_PRECISION[key]:
            raise _refuse(
                f"init_args.{key}={item!r}",
                f"{_PRECISION}: quantized (QLoRA) training computes something else; leave it "
                "out or set it False",
            )
        _ignore(f"init_args.{key}", item, _PRECISION)
    elif key in PLACEMENT_KEYS[section]:
        _ignore(f"{section}.{key}", item, PLACEMENT_KEYS[section][key])
    else:
        raise _refuse(f"{section}.{key}", _ENGINE_NOTE)


_SAME_NAME = set(TrainConfig.__annotations__) - {
    "allow_training_without_logprobs", "logprob_calculation_chunk_size", "packed_sequence_length",
    "ppo", "scale_rewards",
}  # fmt: skip
_CHUNK_NOTE = (
    "the trainer computes logits only at the trained positions, in forwards of at most "
    "TrainConfig.micro_batch_tokens padded tokens (2048 by default): lower micro_batch_tokens "
    "to use less memory"
)
# Accepted with no effect: every completion the server recorded has its sampler logprobs.
_NO_EFFECT = {"allow_training_without_logprobs"}


def _dev_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """ART's dev TrainConfig as ART's `backend.train` keywords (the table in the docstring),
    refusing a key that has no counterpart by name."""
    options: dict[str, Any] = {}
    for key, value in config.items():
        if key == "ppo":
            options["loss_fn"] = "ppo" if value else "cispo"
        elif key == "logprob_calculation_chunk_size":
            _ignore(f"TrainConfig.{key}", value, _CHUNK_NOTE)
        elif (
            key in _SAME_NAME
            or key in _NO_EFFECT
            or key in ("packed_sequence_length", "scale_rewards")
        ):
            options[key] = value
        elif key in _ONLY_DEFAULT and value == ART_TRAIN_DEFAULTS[key]:
            continue
        else:
            raise _refuse(
                f"TrainConfig.{key}",
                _ONLY_DEFAULT.get(key, "the options this trainer has are art.TrainConfig's fields"),
            )
    return options


def train_config(config: Mapping[str, Any], **fields: Any) -> _TrainConfig:
    """ART's dev TrainConfig (its `_config`) as our `art.TrainConfig`, with `fields` over it
    (what `model.train(groups, config=..., _config=...)` sends)."""
    mapped: dict[str, Any] = {}
    for key, value in _dev_options(config).items():
        if key == "loss_fn":
            if value == "ppo":
                mapped["loss"] = "ppo"
        elif key == "scale_rewards":
            mapped["scale_rewards"] = "group" if value else "none"
        elif key == "packed_sequence_length":
            if value is not None:
                mapped["max_length"] = value
        elif key not in _NO_EFFECT:
            mapped[key] = value
    return _TrainConfig(**{**mapped, **fields})


def art_train_options(config: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """ART's dev TrainConfig added to ART's `backend.train` keywords `given`; a setting given
    both ways is refused (which one wins would be a guess)."""
    options = _dev_options(config)
    both = sorted(set(options) & set(given))
    if both:
        raise UnsupportedOptionError(
            f"backend.train(): {', '.join(both)} given both as a keyword and in _config: give "
            "each once."
        )
    return {**given, **options}


__getattr__ = module_getattr("art.dev", __name__)
