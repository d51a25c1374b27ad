"""ART's `art.dev`: its developer settings, as the typed dicts ART code writes, mapped onto ours.

    model = art.TrainableModel(
        name="agent", base_model="...",
        _internal_config=art.dev.InternalModelConfig(
            init_args=art.dev.InitArgs(dtype="float32"),
            engine_args=art.dev.EngineArgs(max_num_seqs=16),
        ),
    )

The keys we honour and where they go (anything else raises `UnsupportedOptionError` naming what
to use here; an engine setting we have no counterpart for says so):

    InternalModelConfig / BackendModelConfig
      lora_config: rank, alpha, dropout,         TrainableModel(lora_config=...)
        target_modules
      init_args.dtype, engine_args.dtype         LocalBackend(dtype=...), when it is "auto"
      engine_args.max_num_seqs                   LocalBackend(max_batch_size=...), when default
      init_args.max_seq_length,                  refused: per step, TrainConfig(max_length=...)
        engine_args.max_model_len
    TrainConfig (ART's `_config` of model.train) the TrainConfig fields of the same name;
                                                 ppo=True: loss="ppo"; scale_rewards: bool
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from art_core._refused_art_names import module_getattr
from art_core.errors import UnsupportedOptionError
from art_core.types import TrainConfig as _TrainConfig

__all__ = [
    "BackendModelConfig",
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "LoRAConfig",
    "PeftArgs",
    "RolloutWeightUpdateMode",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "model_settings",
    "train_config",
]

RolloutWeightUpdateMode = Literal["step_lora", "in_flight_lora"]


class InitArgs(TypedDict, total=False):
    """ART's model-loading arguments; `dtype` is honoured."""

    dtype: str | None


class EngineArgs(TypedDict, total=False):
    """ART's vLLM engine arguments; `dtype` and `max_num_seqs` are honoured."""

    dtype: str
    max_num_seqs: int


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


BackendModelConfig = InternalModelConfig


class TrainConfig(TypedDict, total=False):
    """ART's `model.train(..., _config=...)` experimental options (see `train_config`)."""

    advantage_balance: float
    epsilon: float
    epsilon_high: float | None
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"]
    kl_penalty_coef: float
    kl_penalty_source: Literal["current_learner", "sample"]
    mask_prob_ratio: bool
    max_negative_advantage_importance_sampling_weight: float
    num_trajectories_learning_rate_multiplier_power: float
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
_LORA_KEYS = {
    "rank": "r",
    "alpha": "alpha",
    "dropout": "dropout",
    "target_modules": "target_modules",
}
_SECTION_NOTES = {
    "trainer_args": _TRAINER_NOTE,
    "tinker_args": "Tinker is not a backend here",
    "tinker_native_args": "Tinker is not a backend here",
    "trainer_gpu_ids": "device placement is `art-server --trainer/--engine` (LocalBackend(extra_args=...))",
    "inference_gpu_ids": "device placement is `art-server --trainer/--engine` (LocalBackend(extra_args=...))",
    "vllm_runtime": "an external vLLM is LocalBackend(extra_args=['--engine', 'vllm', '--vllm-url', URL])",
}


def _refuse(path: str, note: str) -> UnsupportedOptionError:
    return UnsupportedOptionError(f"art.dev {path} is not honoured here: {note}.")


def model_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """ART's InternalModelConfig as our settings: `lora` (LoRAConfig fields), `dtype`,
    `max_batch_size` (LocalBackend's); raises UnsupportedOptionError for any key we do not honour."""
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
                if key == "dtype" and item is not None:
                    settings["dtype"] = item
                elif key == "max_num_seqs" and section == "engine_args":
                    settings["max_batch_size"] = int(item)
                elif key in ("max_seq_length", "max_model_len"):
                    raise _refuse(
                        f"{section}.{key}",
                        "the longest row is per step: art.TrainConfig(max_length=...)",
                    )
                else:
                    raise _refuse(f"{section}.{key}", _ENGINE_NOTE)
        else:
            raise _refuse(section, _SECTION_NOTES.get(section, _ENGINE_NOTE))
    return settings


_SAME_NAME = set(TrainConfig.__annotations__) - {"ppo", "scale_rewards"}


def train_config(config: Mapping[str, Any], **fields: Any) -> _TrainConfig:
    """ART's dev TrainConfig (its `_config`) as our `art.TrainConfig`, with `fields` over it."""
    mapped: dict[str, Any] = {}
    for key, value in config.items():
        if key in _SAME_NAME:
            mapped[key] = value
        elif key == "ppo":
            if value:
                mapped["loss"] = "ppo"
        elif key == "scale_rewards":
            mapped["scale_rewards"] = "group" if value else "none"
        else:
            raise _refuse(
                f"TrainConfig.{key}", "the options this trainer has are art.TrainConfig's fields"
            )
    return _TrainConfig(**{**mapped, **fields})


__getattr__ = module_getattr("art.dev", __name__)
