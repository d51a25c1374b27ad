"""ART main's `art.training.contracts`: the requests and results of the training client.

Every contract is a frozen pydantic model that refuses unknown fields, so a request is checked
whole when it is built (a typo, a negative learning rate, a learner transition that skips a
version: `pydantic.ValidationError` naming the field), and an operation's result can be kept
and compared. The shapes follow ART's main branch (newer than 0.5.23); what differs here:

- a batch is trajectories (`RlTrajectoryBatch`, `SupervisedTrajectoryBatch`) or an immutable
  input object (`TrainingInputObjectRef`) holding the exact tokens they resolved to; the
  trajectories' tokens are the server's records of their completions, as for every other way
  of training here;
- `AdamConfig`'s defaults are ART main's (beta2 0.99, eps 1e-13, weight decay 0.1, gradient
  clipping at norm 0.1);
- `SamplerPublication` serves `"none"` and `"versioned_lora"` (each saved step is served as
  `<name>@<step>`); ART's `"in_flight_lora"` and `"merged_weights"` are refused when the
  request is built, naming what to use.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    field_validator,
    model_validator,
)

from art_core.trajectories import Trajectory, TrajectoryGroup

__all__ = [
    "AdamConfig",
    "CheckpointRef",
    "Contract",
    "ForwardBackwardRequest",
    "ForwardBackwardResult",
    "ForwardRequest",
    "ForwardResult",
    "LoadStateRequest",
    "LoadStateResult",
    "LossConfig",
    "LossFnOutput",
    "OperationKind",
    "OperationRef",
    "OptimStepRequest",
    "OptimStepResult",
    "PackingOutcome",
    "PolicyTokenCount",
    "RlTrajectoryBatch",
    "RunCommand",
    "SamplerPublication",
    "SamplerWeightsResult",
    "SaveStateRequest",
    "SaveStateResult",
    "SaveWeightsForSamplerRequest",
    "SupervisedTrajectoryBatch",
    "TrainingBatch",
    "TrainingInputObject",
    "TrainingInputObjectRef",
]

MAX_IDENTIFIER = 255
MAX_REFERENCE = 2048
SHA256 = r"^[0-9a-f]{64}$"
RL_LOSSES = ("cispo", "ppo", "importance_sampling")


class Contract(BaseModel):
    """A frozen contract: built once, checked whole, never changed."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class RunCommand(Contract):
    """A command to one training run: which run, the caller's id for it (a repeat with the
    same id and body is answered once), and its place in the run's order (0, 1, 2, ...)."""

    run_id: str = Field(min_length=1, max_length=MAX_IDENTIFIER)
    request_id: str = Field(min_length=1, max_length=MAX_IDENTIFIER)
    sequence_id: int = Field(ge=0)


# ----------------------------------------------------------------------------------- batches


class RlTrajectoryBatch(Contract):
    """Scored groups to learn from by reinforcement: each group's trajectories are compared
    (advantage: reward minus the group's mean, over its spread with `normalize_advantages`).
    `min_source_version`/`max_source_version`: the learner versions the rollouts sampled from
    (an adapter lease pins a rollout to one)."""

    kind: Literal["rl"] = "rl"
    groups: tuple[TrajectoryGroup, ...] = Field(min_length=1)
    min_source_version: int = Field(default=0, ge=0)
    max_source_version: int = Field(default=0, ge=0)

    @field_validator("groups", mode="before")
    @classmethod
    def _groups(cls, value: Any) -> Any:
        if isinstance(value, TrajectoryGroup):
            return (value,)
        groups = tuple(value) if isinstance(value, list | tuple) else value
        if isinstance(groups, tuple):
            for group in groups:
                if not isinstance(group, TrajectoryGroup):
                    raise ValueError(
                        f"groups holds art.TrajectoryGroup objects, got {type(group).__name__}"
                    )
                if not group.trajectories:
                    raise ValueError("a group without trajectories has nothing to compare")
        return groups

    @model_validator(mode="after")
    def _versions(self) -> RlTrajectoryBatch:
        if self.max_source_version < self.min_source_version:
            raise ValueError("max_source_version must be >= min_source_version")
        return self


class SupervisedTrajectoryBatch(Contract):
    """Trajectories to imitate (cross-entropy on their assistant turns: all, or each
    trajectory's last). The turns trained are the server's records of those completions."""

    kind: Literal["sft"] = "sft"
    trajectories: tuple[Trajectory, ...] = Field(min_length=1)
    assistant_turns: Literal["all", "last"] = "all"


class TrainingInputObject(Contract):
    """An immutable stored input: where it is, its size and its SHA-256 (checked on use)."""

    store: Literal["local"] = "local"
    locator: str = Field(min_length=1, max_length=MAX_REFERENCE)
    size_bytes: int = Field(ge=1)
    sha256: str = Field(pattern=SHA256)


class TrainingInputObjectRef(Contract):
    """A batch by reference: the exact token rows a batch resolved to, stored once
    (`TrainingClient.put_input`) and trained from as often as wanted, identical each time,
    even after the server has evicted the completions' records."""

    kind: Literal["input_object"] = "input_object"
    run_id: str = Field(min_length=1, max_length=MAX_IDENTIFIER)
    encoding: Literal["art_core_datums_json_v1"] = "art_core_datums_json_v1"
    object: TrainingInputObject
    batch_kind: Literal["rl", "sft"]


TrainingBatch = Annotated[
    RlTrajectoryBatch | SupervisedTrajectoryBatch | TrainingInputObjectRef,
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------------------------- requests


class LossConfig(Contract):
    """The loss: `cross_entropy` for a supervised batch; `cispo`, `ppo` or
    `importance_sampling` for a reinforcement batch. `values`: the loss's settings (Tinker's
    `loss_fn_config`, e.g. `clip_low_threshold`), checked by the server."""

    name: Literal["cross_entropy", "cispo", "ppo", "importance_sampling"]
    normalize_advantages: bool = True
    values: dict[str, float | int | bool | str | None] = Field(default_factory=dict)


class ForwardRequest(RunCommand):
    """Score a batch under the current weights (no gradient)."""

    batch: TrainingBatch
    loss: LossConfig
    collect_packing_shapes: bool = False

    @model_validator(mode="after")
    def _loss_fits_batch(self) -> ForwardRequest:
        batch = self.batch
        kind = batch.batch_kind if isinstance(batch, TrainingInputObjectRef) else batch.kind
        expected = ("cross_entropy",) if kind == "sft" else RL_LOSSES
        if self.loss.name not in expected:
            raise ValueError(
                f"{kind} batches take the loss {' or '.join(expected)}, got {self.loss.name!r}"
            )
        if isinstance(self.batch, TrainingInputObjectRef) and self.batch.run_id != self.run_id:
            raise ValueError(
                f"the input object was stored for run {self.batch.run_id!r}, not {self.run_id!r}"
            )
        return self


class ForwardBackwardRequest(ForwardRequest):
    """Score a batch and add its gradient; `optim_step` applies the gradients added since."""


class AdamConfig(Contract):
    """AdamW's settings for one step (ART main's defaults)."""

    learning_rate: FiniteFloat = Field(ge=0)
    beta1: FiniteFloat = Field(default=0.9, ge=0, lt=1)
    beta2: FiniteFloat = Field(default=0.99, ge=0, lt=1)
    eps: FiniteFloat = Field(default=1e-13, gt=0)
    weight_decay: FiniteFloat = Field(default=0.1, ge=0)
    grad_clip_norm: FiniteFloat = Field(default=0.1, ge=0)


class OptimStepRequest(RunCommand):
    """Apply the gradients added since the last step: the learner's version advances by one."""

    optimizer: AdamConfig


class SamplerPublication(Contract):
    """How saved weights reach the sampler: `"none"` (saved only), or `"versioned_lora"`
    under `model_alias` (the model's name: served as `<name>@<step>`)."""

    mode: Literal["none", "versioned_lora", "in_flight_lora", "merged_weights"]
    model_alias: str | None = Field(default=None, min_length=1, max_length=MAX_IDENTIFIER)

    @model_validator(mode="after")
    def _served_here(self) -> SamplerPublication:
        if (self.mode == "none") != (self.model_alias is None):
            raise ValueError("model_alias is required exactly when publication is enabled")
        if self.mode in ("in_flight_lora", "merged_weights"):
            raise ValueError(
                f"publication mode {self.mode!r} is not served: every saved step is served "
                "immutably as <name>@<step> (mode='versioned_lora'); pin a rollout to one "
                "with backend.adapter_lease(model, step)"
            )
        return self


class SaveWeightsForSamplerRequest(RunCommand):
    """Save the adapter for sampling (and publish it as the model's next step)."""

    checkpoint_name: str = Field(min_length=1, max_length=MAX_IDENTIFIER)
    ttl_seconds: int | None = Field(default=None, ge=1)
    publication: SamplerPublication


class SaveStateRequest(RunCommand):
    """Save the adapter and the optimizer's state, to resume from."""

    checkpoint_name: str = Field(min_length=1, max_length=MAX_IDENTIFIER)
    ttl_seconds: int | None = Field(default=None, ge=1)
    overwrite: bool = False


class LoadStateRequest(RunCommand):
    """Load a saved state (`tinker://...` path); with `restore_optimizer`, its optimizer too."""

    checkpoint: str = Field(min_length=1, max_length=MAX_REFERENCE)
    restore_optimizer: bool = False


# ----------------------------------------------------------------------------------- results

OperationKind = Literal[
    "forward", "forward_backward", "optim_step", "save_sampler", "save_state", "load_state"
]
TRANSITIONS = ("optim_step", "load_state")


class OperationRef(Contract):
    """One admitted operation: its run, id and place, the learner version it starts from, and
    for a transition (an optimizer step, a load) the version it will produce (one more)."""

    run_id: str = Field(min_length=1, max_length=MAX_IDENTIFIER)
    operation_id: str = Field(min_length=1, max_length=64)
    sequence_id: int = Field(ge=0)
    learner_parent_version: int = Field(ge=0)
    reserved_output_learner_version: int | None = Field(default=None, ge=1)
    kind: OperationKind

    @model_validator(mode="after")
    def _transition(self) -> OperationRef:
        transition = self.kind in TRANSITIONS
        if transition != (self.reserved_output_learner_version is not None):
            raise ValueError(
                "optimizer steps and loads reserve an output learner version; other "
                "operations do not"
            )
        if transition and self.reserved_output_learner_version != self.learner_parent_version + 1:
            raise ValueError("a learner transition advances exactly one version")
        return self


class CheckpointRef(Contract):
    """A learner version and where its weights are (a `tinker://` path, or the version)."""

    run_id: str = Field(min_length=1, max_length=MAX_IDENTIFIER)
    learner_version: int = Field(ge=0)
    checkpoint_id: str = Field(min_length=1, max_length=MAX_REFERENCE)


class PolicyTokenCount(Contract):
    """How many trained tokens were sampled from one policy version (`<name>@<version>`)."""

    policy_version: int = Field(ge=0)
    trainable_assistant_tokens: int = Field(ge=1)


class PackingOutcome(Contract):
    """What a batch held, as token rows: their count, lengths, and the tokens that carry the
    loss, by the policy version that sampled them where the records say. (The server packs
    rows sharing a prompt into one forward itself; these are the rows before that.)"""

    packed_sequence_length: int = Field(ge=1)
    packed_sequences: int = Field(ge=1)
    target_packed_sequences: int = Field(ge=1)
    nominal_capacity_tokens: int = Field(ge=1)
    physical_tokens: int = Field(ge=1)
    non_padding_tokens: int = Field(ge=1)
    loss_bearing_tokens: int = Field(ge=0)
    trainable_assistant_tokens: int = Field(ge=0)
    policy_token_counts: tuple[PolicyTokenCount, ...] | None = None
    group_shapes: tuple[dict[str, int], ...] = ()

    @model_validator(mode="after")
    def _counts(self) -> PackingOutcome:
        if self.non_padding_tokens > self.physical_tokens:
            raise ValueError("non_padding_tokens cannot exceed physical_tokens")
        counts = self.policy_token_counts
        if counts is not None:
            versions = [count.policy_version for count in counts]
            if versions != sorted(set(versions)):
                raise ValueError("policy_token_counts must be unique and sorted")
            if sum(c.trainable_assistant_tokens for c in counts) != (
                self.trainable_assistant_tokens
            ):
                raise ValueError("policy_token_counts must sum to trainable_assistant_tokens")
        return self


class LossFnOutput(Contract):
    """One row's result: the log-probability of each of its target tokens."""

    token_logprobs: tuple[float, ...]
    metrics: dict[str, float] = Field(default_factory=dict)


class ForwardResult(Contract):
    """A forward's result: per row, its log-probabilities; the step's metrics."""

    operation_id: str = Field(min_length=1)
    packing: PackingOutcome
    loss_fn_outputs: tuple[LossFnOutput, ...]
    metrics: dict[str, float] = Field(default_factory=dict)


class ForwardBackwardResult(ForwardResult):
    """A forward-backward's result (the gradient is kept for the next `optim_step`)."""


class OptimStepResult(Contract):
    """An optimizer step's result: the forward-backwards it applied and the new version."""

    operation_id: str = Field(min_length=1)
    contributing_forward_backward_operation_ids: tuple[str, ...] = Field(min_length=1)
    checkpoint: CheckpointRef
    metrics: dict[str, float] = Field(default_factory=dict)


class SamplerWeightsResult(Contract):
    """Saved sampler weights: their path, and the served name when published."""

    operation_id: str = Field(min_length=1)
    checkpoint: CheckpointRef
    lora: str = Field(min_length=1)
    served_model: str | None = None
    publication_metrics: dict[str, float] = Field(default_factory=dict)


class SaveStateResult(Contract):
    """A saved state: its path (weights and optimizer)."""

    operation_id: str = Field(min_length=1)
    checkpoint: CheckpointRef
    optimizer_state: str = Field(min_length=1)


class LoadStateResult(Contract):
    """A loaded state: the new learner version, and whether the optimizer was restored."""

    operation_id: str = Field(min_length=1)
    checkpoint: CheckpointRef
    optimizer_restored: bool
