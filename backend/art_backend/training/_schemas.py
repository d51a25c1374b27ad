"""Request bodies of the training API (`/v1/training/...`): what `art_core` sends, validated here.

The settings models (LoRA, train, SFT) are art_core's, imported (art_core has no torch).

Unknown fields are rejected (a misspelt option must not be silently ignored) and every number
has its range, so a bad config is a 400 that names the field before anything trains.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The settings are the client's own models: one definition of every field, range and default.
from art_core._config import LoRAConfig as LoraSettings
from art_core._config import TrainConfig as TrainSettings
from art_core._config import TrainSFTConfig as SFTSettings
from art_core.names import check_name, check_split


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_name(value: str, what: str) -> str:
    return check_name(value, what)


class ForkFrom(_Strict):
    project: str
    name: str
    step: int | None = Field(None, ge=0)  # None: the source's latest step


class RegisterRequest(_Strict):
    project: str
    name: str
    base_model: str
    lora: LoraSettings = LoraSettings()
    fork_from: ForkFrom | None = None
    seed: int = 0

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        return _check_name(value, "project name")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _check_name(value, "model name")


class TurnRef(_Strict):
    """A trainable assistant turn: a choice of a completion this server recorded."""

    completion_id: str
    choice_index: int = Field(0, ge=0)


class HistoryPayload(_Strict):
    """One conversation of a trajectory: its messages (for logs) and its trainable turns in order."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    turns: list[TurnRef] = Field(default_factory=list)


class TrajectoryPayload(_Strict):
    id: str
    reward: float
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    histories: list[HistoryPayload] = Field(default_factory=list)
    context_assistant_messages: int = Field(0, ge=0)  # plain-dict assistant turns: not trained

    @field_validator("reward")
    @classmethod
    def _finite_reward(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"reward must be a finite number, got {value}")
        return value


class GroupPayload(_Strict):
    trajectories: list[TrajectoryPayload]
    exceptions: list[str] = Field(default_factory=list)  # rollouts that raised: counted
    metrics: dict[str, float] = Field(default_factory=dict)  # group-level: summed over groups


class TrainRequest(_Strict):
    groups: list[GroupPayload]
    config: TrainSettings = TrainSettings()
    # Counted by the client before sending (e.g. groups an `after_each` judge dropped).
    client_metrics: dict[str, float] = Field(default_factory=dict)


class SFTExample(_Strict):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


class SFTRequest(_Strict):
    trajectories: list[SFTExample]
    config: SFTSettings = SFTSettings()


class LogRequest(_Strict):
    groups: list[GroupPayload]
    split: str = "val"

    @field_validator("split")
    @classmethod
    def _split(cls, value: str) -> str:
        return check_split(value)


class DeleteCheckpointsRequest(_Strict):
    best_checkpoint_metric: str = "val/reward"
    maximize: bool = True


def trajectory_rows(
    groups: list[GroupPayload], annotations: dict[tuple[int, str], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The rows of `trajectories/<split>/<step>.jsonl.gz`: one per trajectory and per exception.

    `annotations[(group index, trajectory id)]` adds what the trainer did with a trajectory
    (its advantage, a reviewer's decision it applied).
    """
    rows = []
    for group_index, group in enumerate(groups):
        for trajectory in group.trajectories:
            extra = (annotations or {}).get((group_index, trajectory.id), {})
            rows.append({"group": group_index, **trajectory.model_dump(), **extra})
        for exception in group.exceptions:
            rows.append({"group": group_index, "exception": exception})
    return rows
