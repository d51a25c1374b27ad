"""The JSON requests of the Tinker API, as `tinker` 0.38 sends them (`tinker/types/`).

Field names and defaults are the SDK's. Fields a newer SDK adds are ignored rather than refused
(`extra="ignore"`), so a minor SDK upgrade keeps working; options this server does not serve yet
are refused by name where they are read (`_service`, `_sampling`). `forward_backward` is not
here: the SDK sends it as protobuf (`_proto`).

Types are strict, as on the OpenAI routes: an integer field takes a JSON integer (not `"4"`, not
`true`), a flag takes `true` or `false`, and a float is finite (`Infinity` and `NaN`, which
Python's JSON reader takes, are refused: an infinite learning rate turned every weight NaN).
The sampling bounds are the engine's own (`engines._engine`: temperature, stop characters) and
the seed's (`art_core.wire.SEED_RANGE`), one definition each, checked here first so that the
400 names the field as the SDK sent it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StrictBool,
    StrictInt,
)

from art_backend.engines._engine import MAX_STOP_CHARACTERS, TEMPERATURE_RANGE
from art_core.wire import SEED_RANGE

MAX_LOGPROBS_K = 20  # the top-k logprob fields: OpenAI's top_logprobs bound


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


def _stop_characters(
    stop: str | list[str] | list[int] | None,
) -> str | list[str] | list[int] | None:
    """Stop strings of at most MAX_STOP_CHARACTERS characters in all, as on every route."""
    strings = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
    if sum(len(s) for s in strings) > MAX_STOP_CHARACTERS:
        raise ValueError(
            f"stop strings hold at most {MAX_STOP_CHARACTERS:,} characters in all; stop on a "
            "shorter marker"
        )
    return stop


Seed = Annotated[StrictInt, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])]
StopSequences = Annotated[
    str | list[str] | list[StrictInt] | None, AfterValidator(_stop_characters)
]


class ClientConfigRequest(_Wire):
    sdk_version: str = ""


class CreateSessionRequest(_Wire):
    tags: list[str] = Field(default_factory=list)
    user_metadata: dict[str, Any] | None = None
    sdk_version: str = ""
    project_id: str | None = None
    display_name: str | None = None


class SessionHeartbeatRequest(_Wire):
    session_id: str


class LoraConfig(_Wire):
    rank: StrictInt = Field(ge=1, le=1024)  # and at most the model's width (`create_model`)
    seed: Seed | None = None
    train_unembed: StrictBool = True
    train_mlp: StrictBool = True
    train_attn: StrictBool = True


class OptimizerConfig(_Wire):
    type: str = "adamw"


class CreateModelRequest(_Wire):
    session_id: str
    model_seq_id: StrictInt = 0
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = OptimizerConfig()


class GetInfoRequest(_Wire):
    model_id: str


class AdamParams(_Wire):
    """AdamW's settings for one step; the SDK's defaults (note beta2 0.95, eps 1e-12)."""

    learning_rate: FiniteFloat = Field(1e-4, ge=0)
    beta1: FiniteFloat = Field(0.9, ge=0, lt=1)
    beta2: FiniteFloat = Field(0.95, ge=0, lt=1)
    eps: FiniteFloat = Field(1e-12, gt=0)
    weight_decay: FiniteFloat = Field(0.0, ge=0)
    grad_clip_norm: FiniteFloat = Field(0.0, ge=0)  # 0: no clipping


class OptimStepRequest(_Wire):
    adam_params: AdamParams | None = None
    # A non-Adam optimizer's step (the SDK sends Dimuon's here): refused by name.
    optimizer_params: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("optimizer_params", "optim_params")
    )
    model_id: str
    seq_id: StrictInt | None = None


class SaveWeightsForSamplerRequest(_Wire):
    model_id: str
    path: str | None = None
    sampling_session_seq_id: StrictInt | None = None
    kind: str = "snapshot"
    seq_id: StrictInt | None = None
    ttl_seconds: StrictInt | None = None
    user_metadata: dict[str, str] | None = None


class CreateSamplingSessionRequest(_Wire):
    session_id: str
    sampling_session_seq_id: StrictInt = 0
    base_model: str | None = None
    model_path: str | None = None


class ModelInputChunk(_Wire):
    type: str = "encoded_text"
    tokens: list[StrictInt] | None = None


class ModelInput(_Wire):
    chunks: list[ModelInputChunk]


class SamplingParams(_Wire):
    max_tokens: StrictInt | None = Field(None, ge=1)
    seed: Seed | None = None
    stop: StopSequences = None
    temperature: FiniteFloat = Field(1.0, ge=TEMPERATURE_RANGE[0], le=TEMPERATURE_RANGE[1])
    top_k: StrictInt = Field(-1, ge=-1)  # -1 (the SDK's) and 0: no top-k
    top_p: FiniteFloat = Field(1.0, gt=0, le=1)


class SampleRequest(_Wire):
    num_samples: StrictInt = Field(1, ge=1, le=128)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: StrictInt | None = None
    prompt_logprobs: StrictBool | None = None
    topk_prompt_logprobs: StrictInt = Field(0, ge=0, le=MAX_LOGPROBS_K)
    topk_sample_logprobs: StrictInt = Field(0, ge=0, le=MAX_LOGPROBS_K)
    target_prompt_logprobs: dict[str, Any] | None = None
    prompt_alt_tokens_k: StrictInt = Field(0, ge=0, le=MAX_LOGPROBS_K)
    prompt_logprobs_last_n: StrictInt | None = Field(None, ge=1)
    record_stability_info: StrictBool | None = None
    type: Literal["sample"] = "sample"


class FutureRetrieveRequest(_Wire):
    request_id: str
    allow_metadata_only: StrictBool = False


class SaveWeightsRequest(_Wire):
    model_id: str
    path: str | None = None
    seq_id: StrictInt | None = None
    ttl_seconds: StrictInt | None = None
    overwrite: StrictBool = False
    user_metadata: dict[str, str] | None = None


class LoadWeightsRequest(_Wire):
    """Into a run (model_id, seq_id: `load_state`), or a new run (session_id, model_seq_id:
    `create_training_client_from_state[_with_optimizer]`)."""

    model_id: str | None = None
    seq_id: StrictInt | None = None
    session_id: str | None = None
    model_seq_id: StrictInt | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None
    path: str
    optimizer: StrictBool = False
    optimizer_config: OptimizerConfig | None = None
    weights_access_token: str | None = None


class WeightsInfoRequest(_Wire):
    tinker_path: str


class CheckpointTtlRequest(_Wire):
    ttl_seconds: StrictInt | None
