"""The JSON requests of the Tinker API, as `tinker` 0.38 sends them (`tinker/types/`).

Field names and defaults are the SDK's. Fields a newer SDK adds are ignored rather than refused
(`extra="ignore"`), so a minor SDK upgrade keeps working; options this server does not serve yet
are refused by name where they are read (`_service`, `_sampling`). `forward_backward` is not
here: the SDK sends it as protobuf (`_proto`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


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
    rank: int = Field(ge=1, le=1024)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfig(_Wire):
    type: str = "adamw"


class CreateModelRequest(_Wire):
    session_id: str
    model_seq_id: int = 0
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = OptimizerConfig()


class GetInfoRequest(_Wire):
    model_id: str


class AdamParams(_Wire):
    """AdamW's settings for one step; the SDK's defaults (note beta2 0.95, eps 1e-12)."""

    learning_rate: float = Field(1e-4, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)  # 0: no clipping


class OptimStepRequest(_Wire):
    adam_params: AdamParams | None = None
    # A non-Adam optimizer's step (the SDK sends Dimuon's here): refused by name.
    optimizer_params: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("optimizer_params", "optim_params")
    )
    model_id: str
    seq_id: int | None = None


class SaveWeightsForSamplerRequest(_Wire):
    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: str = "snapshot"
    seq_id: int | None = None
    ttl_seconds: int | None = None
    user_metadata: dict[str, str] | None = None


class CreateSamplingSessionRequest(_Wire):
    session_id: str
    sampling_session_seq_id: int = 0
    base_model: str | None = None
    model_path: str | None = None


class ModelInputChunk(_Wire):
    type: str = "encoded_text"
    tokens: list[int] | None = None


class ModelInput(_Wire):
    chunks: list[ModelInputChunk]


class SamplingParams(_Wire):
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(1.0, ge=0)
    top_k: int = -1
    top_p: float = Field(1.0, gt=0, le=1)


class SampleRequest(_Wire):
    num_samples: int = Field(1, ge=1, le=128)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: dict[str, Any] | None = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = None
    type: Literal["sample"] = "sample"


class FutureRetrieveRequest(_Wire):
    request_id: str
    allow_metadata_only: bool = False


class SaveWeightsRequest(_Wire):
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    ttl_seconds: int | None = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None


class LoadWeightsRequest(_Wire):
    """Into a run (model_id, seq_id: `load_state`), or a new run (session_id, model_seq_id:
    `create_training_client_from_state[_with_optimizer]`)."""

    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None
    path: str
    optimizer: bool = False
    optimizer_config: OptimizerConfig | None = None
    weights_access_token: str | None = None
