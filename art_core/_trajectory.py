"""Trajectory, History and TrajectoryGroup: the runs of an agent and their rewards.

A trajectory's `messages_and_choices` mixes plain message dicts (context: system, user, tool
results, and assistant turns not sampled from our backend) with OpenAI `Choice` objects returned
by our backend. A `Choice` carries its `completion_id`, which lets the backend train on the exact
tokens it sampled; a plain-dict assistant message is context only (counted, never trained).
"""

from __future__ import annotations

import inspect
import math
import traceback
import uuid
from collections.abc import Awaitable, Iterable
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, field_validator

from art_core._errors import InvalidTrajectoryError
from art_core._strict import StrictModel

MessageOrChoice = Any  # a message dict, or an `openai.types.chat.chat_completion.Choice`


# `messages=` is what an OpenAI user writes; it is refused rather than taken as an alias: ART has
# no such field either (`messages()` is the method that reads the conversation back), and the
# name hides that the Choice objects, not plain dicts, are what trains.
_MESSAGES_HINT = (
    "Pass the conversation as messages_and_choices=[...]: message dicts for context and the "
    "`Choice` objects of your completions (`response.choices[0]`) for the turns to train; "
    "`.messages()` reads it back as plain messages."
)


class History(StrictModel):
    """One more conversation of a trajectory (a sub-agent, a parallel branch), same reward."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    unknown_field_hints: ClassVar[dict[str, str]] = {"messages": _MESSAGES_HINT}

    messages_and_choices: list[MessageOrChoice] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    def messages(self) -> list[dict[str, Any]]:
        """The conversation as plain message dicts (choices turned into assistant messages)."""
        return [_as_message(item) for item in self.messages_and_choices]


class Trajectory(History):
    """One run of the agent on one scenario: its conversation(s), reward, metrics and logs."""

    model_config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, validate_assignment=True
    )

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    additional_histories: list[History] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"reward must be a finite number, got {value}")
        return value

    def log(self, message: str) -> None:
        """Append a line to this trajectory's logs (kept with it on disk)."""
        self.logs.append(message)

    def histories(self) -> list[History]:
        """The main conversation first, then the additional ones."""
        return [
            History(messages_and_choices=self.messages_and_choices, tools=self.tools),
            *list(self.additional_histories),
        ]


class RolloutException(StrictModel):
    """A rollout that raised: kept on its group, counted in the step's metrics."""

    type: str
    message: str
    traceback: str
    # The calls the run made before it failed, when it ran in a `model.rollout()` scope: for
    # review only, never trained (a failed run has no reward).
    partial_trajectory: Trajectory | None = None

    @classmethod
    def from_exception(cls, error: BaseException) -> RolloutException:
        return cls(
            type=type(error).__name__,
            message=str(error),
            traceback="".join(traceback.format_exception(error)),
            partial_trajectory=getattr(error, "art_trajectory", None),
        )


class TrajectoryGroup:
    """The runs of one scenario that GRPO compares; built from trajectories or awaitables of them.

    `TrajectoryGroup(rollout(model, s) for _ in range(8))` holds eight pending rollouts;
    `gather_trajectory_groups` runs them. Exceptions are kept on the group, not raised.
    `metrics` are group-level counts (a judge's tokens and cost): the step sums them over groups.
    """

    def __init__(
        self,
        trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]] = (),
        *,
        exceptions: Iterable[BaseException | RolloutException] = (),
        metadata: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        self.trajectories: list[Trajectory] = []
        self.exceptions: list[RolloutException] = []
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.metrics: dict[str, float] = dict(metrics or {})
        self._pending: list[Awaitable[Trajectory]] = []
        for item in trajectories:
            self._add(item)
        for error in exceptions:
            self.exceptions.append(
                error
                if isinstance(error, RolloutException)
                else RolloutException.from_exception(error)
            )

    def _add(self, item: Any) -> None:
        if isinstance(item, Trajectory):
            self.trajectories.append(item)
        elif isinstance(item, BaseException):
            self.exceptions.append(RolloutException.from_exception(item))
        elif inspect.isawaitable(item):
            self._pending.append(item)
        else:
            raise TypeError(
                f"A TrajectoryGroup holds Trajectory objects or awaitables of them, got {type(item).__name__}"
            )

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self):
        return iter(self.trajectories)

    def __repr__(self) -> str:
        return (
            f"TrajectoryGroup({len(self.trajectories)} trajectories, "
            f"{len(self.exceptions)} exceptions, {len(self._pending)} pending)"
        )

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]


# --------------------------------------------------------------------------------- wire format


def group_payload(group: TrajectoryGroup, *, stats: dict[str, int]) -> dict[str, Any]:
    """The JSON the training API takes for a group; counts context assistant turns in `stats`."""
    if group._pending:
        raise InvalidTrajectoryError(
            "This TrajectoryGroup still holds rollouts that were never run: pass it through "
            "`await art.gather_trajectory_groups(...)` first."
        )
    return {
        "trajectories": [trajectory_payload(t, stats=stats) for t in group.trajectories],
        "exceptions": [f"{e.type}: {e.message}" for e in group.exceptions],
        "metrics": {key: float(value) for key, value in group.metrics.items()},
    }


def trajectory_payload(trajectory: Trajectory, *, stats: dict[str, int]) -> dict[str, Any]:
    histories = []
    context_assistant = 0
    for history in trajectory.histories():
        messages, turns = [], []
        for item in history.messages_and_choices:
            completion_id = _completion_id(item)
            message = _as_message(item)
            messages.append(message)
            if completion_id is not None:
                turns.append({"completion_id": completion_id, "choice_index": item.index})
            elif message.get("role") == "assistant":
                context_assistant += 1
        histories.append({"messages": messages, "tools": history.tools, "turns": turns})
    stats["context_assistant_messages"] = (
        stats.get("context_assistant_messages", 0) + context_assistant
    )
    return {
        "id": trajectory.id,
        "reward": trajectory.reward,
        "metrics": {key: float(value) for key, value in trajectory.metrics.items()},
        "metadata": _jsonable(trajectory.metadata),
        "logs": list(trajectory.logs),
        "histories": histories,
        "context_assistant_messages": context_assistant,
    }


def _completion_id(item: Any) -> str | None:
    if isinstance(item, dict):
        return None
    extra = getattr(item, "model_extra", None) or {}
    value = extra.get("completion_id")
    return value if isinstance(value, str) else None


def _as_message(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        if "role" not in item:
            raise InvalidTrajectoryError(f"A message dict needs a 'role': {item!r:.200}")
        return item
    message = getattr(item, "message", None)
    if message is None:
        raise InvalidTrajectoryError(
            f"messages_and_choices holds a {type(item).__name__}: use message dicts or the "
            "`Choice` objects of a chat completion (`response.choices[0]`)."
        )
    dumped = message.model_dump(exclude_none=True, exclude_unset=False)
    return {key: value for key, value in dumped.items() if key in ("role", "content", "tool_calls")}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
