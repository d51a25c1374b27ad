"""Trajectory, History and TrajectoryGroup: the runs of an agent and their rewards.

A trajectory's `messages_and_choices` mixes plain message dicts (context: system, user, tool
results) with the `Choice` objects our backend returned (an OpenAI `Choice`, or a LiteLLM
`Choices` whose `provider_specific_fields` carry the id, or a `CompletionChoice` of
`client.completions.create`, a base model's plain-text turn: its `text` is the assistant's). A choice carries its `completion_id`,
which lets the backend train on the exact tokens it sampled. A plain-dict assistant message
(`{"role": "assistant", "content": answer}`) is sent as a turn to match: the backend trains it
on the tokens of the completion it recorded with the same conversation before it and the same
answer (text and tool calls); one that matches nothing is context, counted.

Differences from ART 0.5.23, on purpose:
- `TrajectoryGroup(rollouts)` is a group at once (ART returns an awaitable instead); awaiting
  it, `await art.TrajectoryGroup(rollouts)`, runs the rollouts and returns the group, as in ART.
  It may mix trajectories and awaitables (ART raises TypeError), keeps the input order (ART:
  the order of completion), and emits no DeprecationWarning. Outside a gather the first
  exception propagates and cancels the other rollouts (ART leaves them running).
- A rollout's exception is kept as `RolloutException` (`type` is the class name; ART keeps
  `str(type(error))`, "<class 'ValueError'>").
- `Trajectory` refuses unknown fields (UnknownFieldError) and non-finite rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import time
import traceback
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Generator, Iterable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol

from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam
from openai.types.chat.chat_completion_tool_param import ChatCompletionToolParam
from openai.types.completion_choice import CompletionChoice
from pydantic import ConfigDict, Field, SkipValidation, field_validator

from art_core._unknown_fields import StrictModel
from art_core.errors import InvalidTrajectoryError, UnknownFieldError
from art_core.wire import (
    GroupPayload,
    HistoryPayload,
    TrajectoryPayload,
    TurnRef,
    finite_reward,
)

__all__ = [
    "History",
    "Messages",
    "MessagesAndChoices",
    "RolloutException",
    "Tools",
    "Trajectory",
    "TrajectoryGroup",
]

# ART's type aliases (`art.types`), for annotations in user code. The fields below take Any:
# a dict is kept as given and a Choice as returned, never re-validated.
Message = Annotated[ChatCompletionMessageParam, SkipValidation]
MessageOrChoice = Message | Choice | CompletionChoice
Messages = list[Message]
MessagesAndChoices = list[MessageOrChoice]
Tools = list[ChatCompletionToolParam]

# `messages=` was the field's name in ART's first releases, and tutorials still write
# `art.Trajectory(messages=[..., {"role": "assistant", "content": answer}])`: it is taken as
# `messages_and_choices=` (with a DeprecationWarning naming the current field). Its plain-dict
# assistant turns train when they match a completion the server recorded (docs/training.md).
_MESSAGES_HINT = (
    "Pass the conversation as messages_and_choices=[...]: message dicts for context and the "
    "`Choice` objects of your completions (`response.choices[0]`) for the turns to train; "
    "`.messages()` reads it back as plain messages."
)


def _messages_alias(owner: str, data: dict[str, Any]) -> dict[str, Any]:
    """`messages=` (ART's first field name) as `messages_and_choices=`; both at once: an error."""
    if "messages_and_choices" in data:
        raise UnknownFieldError(
            f"{owner}: messages= and messages_and_choices= are one field (messages is its old "
            f"name): pass one. {_MESSAGES_HINT}",
            unknown=["messages"],
            known=sorted(History.model_fields),
        )
    warnings.warn(
        f"{owner}(messages=...) is ART's old name: write messages_and_choices=...",
        DeprecationWarning,
        stacklevel=3,
    )
    data = dict(data)
    data["messages_and_choices"] = data.pop("messages")
    return data


class History(StrictModel):
    """One more conversation of a trajectory (a sub-agent, a parallel branch), same reward."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    messages_and_choices: list[Any] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    def __init__(self, /, **data: Any) -> None:
        if "messages" in data:
            data = _messages_alias(type(self).__name__, data)
        super().__init__(**data)

    # As StrictModel's: validation from data (model_validate, the server) does not call it.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def messages(self) -> list[dict[str, Any]]:
        """The conversation as plain message dicts, as ART's `messages()` gives it: a choice
        becomes an assistant message (content "" when None), a dict is copied."""
        return [_plain_message(item) for item in self.messages_and_choices]


def get_messages(messages_and_choices: MessagesAndChoices) -> list[dict[str, Any]]:
    """ART's `art.trajectories.get_messages`: `History.messages()` of a bare list."""
    return [_plain_message(item) for item in messages_and_choices]


class Trajectory(History):
    """One run of the agent on one scenario: its conversation(s), reward, metrics and logs."""

    model_config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, validate_assignment=True
    )

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    additional_histories: list[History] = Field(default_factory=list)
    reward: float = 0.0
    # Set by ART's pipeline trainer: the policy versions a run started and ended on.
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    # When the trajectory was made: `finish()` measures the run's duration from it. Not saved.
    start_time: datetime = Field(default_factory=lambda: datetime.now(UTC), exclude=True)

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float) -> float:
        return finite_reward(value)

    def __str__(self) -> str:
        return f"Trajectory(reward={self.reward}, metrics={self.metrics}, metadata={self.metadata})"

    def log(self, message: str) -> None:
        """Append a line to this trajectory's logs (kept with it on disk)."""
        self.logs.append(message)

    def finish(self) -> Trajectory:
        """Record `metrics["duration"]`, the seconds since this trajectory was made; returns it."""
        self.metrics["duration"] = (datetime.now(UTC) - self.start_time).total_seconds()
        return self

    @contextlib.asynccontextmanager
    async def track_duration(self, metric_name: str) -> AsyncIterator[None]:
        """`async with t.track_duration("tool"):` adds the block's seconds to
        `metrics["tool_duration"]` (summed over blocks; counted when the block raises too)."""
        started = time.monotonic()
        try:
            yield
        finally:
            key = f"{metric_name}_duration"
            self.metrics[key] = self.metrics.get(key, 0.0) + time.monotonic() - started

    def for_logging(self) -> dict[str, Any]:
        """A JSON-ready summary, as ART's: each message with `trainable` (True for a choice)."""
        messages = []
        for item in self.messages_and_choices:
            trainable = not isinstance(item, dict)
            messages.append({**_full_message(item), "trainable": trainable})
        return {
            "reward": self.reward,
            "initial_policy_version": self.initial_policy_version,
            "final_policy_version": self.final_policy_version,
            "metrics": self.metrics,
            "metadata": self.metadata,
            "messages": messages,
            "tools": self.tools,
            "logs": self.logs,
        }

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
        """The exception's class name, message and formatted traceback."""
        return cls(
            type=type(error).__name__,
            message=str(error),
            traceback="".join(traceback.format_exception(error)),
            partial_trajectory=getattr(error, "art_trajectory", None),
        )


# ------------------------------------------------------------------------- running rollouts


class RolloutObserver(Protocol):
    """What a gather watches while a group's rollouts run (progress, the exception limit)."""

    def started(self, group: TrajectoryGroup, count: int) -> None:
        """`count` rollouts of `group` begin."""

    def done(self, outcome: Trajectory | RolloutException, error: BaseException | None) -> None:
        """One rollout ended; may raise to stop the gather (too many exceptions)."""


# Set by a gather for the rollouts it runs, so `await TrajectoryGroup(...)` inside a gathered
# coroutine reports to it. Unset, an awaited group raises its first rollout exception (as ART's
# does outside a gather, where its limit is 0).
current_observer: ContextVar[RolloutObserver | None] = ContextVar(
    "art_core_rollout_observer", default=None
)


async def run_rollout(
    rollout: Awaitable[Any], observer: RolloutObserver | None
) -> Trajectory | RolloutException:
    """Await one rollout; with an observer a failure is kept as a RolloutException, else raised."""
    try:
        result = await rollout
        if not isinstance(result, Trajectory):
            raise TypeError(f"a rollout must return an art.Trajectory, got {type(result).__name__}")
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if observer is None or task is None or task.cancelling():
            raise  # the gather itself is cancelled (Ctrl-C, the exception limit): stop
        # Cancelled from inside (the agent cancelled its own run): a failed rollout, kept.
        failed = RolloutException.from_exception(error)
        observer.done(failed, error)
        return failed
    except Exception as error:  # a rollout's failure is data: kept on the group
        if observer is None:
            raise
        failed = RolloutException.from_exception(error)
        observer.done(failed, error)
        return failed
    if observer is not None:
        observer.done(result, None)
    return result


async def gather_or_cancel(coroutines: list[Any]) -> list[Any]:
    """asyncio.gather that cancels the siblings when one raises (the exception limit)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class TrajectoryGroup:
    """The runs of one scenario that GRPO compares; built from trajectories or awaitables of them.

    `TrajectoryGroup(rollout(model, s) for _ in range(8))` holds eight pending rollouts;
    `gather_trajectory_groups` runs them, and so does `await` on the group. Exceptions are kept
    on the group, not raised (except by a lone `await`, see the module docstring). `metrics` are
    group-level counts (a judge's tokens and cost): the step sums them over groups.
    """

    def __init__(
        self,
        trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]] = (),
        *,
        exceptions: Iterable[BaseException | RolloutException] = (),
        metadata: dict[str, Any] | None = None,
        metrics: dict[str, float | int | bool] | None = None,
        logs: list[str] | None = None,
    ) -> None:
        self.trajectories: list[Trajectory] = []
        self.exceptions: list[RolloutException] = []
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.metrics: dict[str, float | int | bool] = dict(metrics or {})
        self.logs: list[str] = list(logs or [])
        self._pending: list[Awaitable[Trajectory]] = []
        for item in trajectories:
            self._add(item)
        # Given exceptions after the rollouts' own, as ART orders them.
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

    def __await__(self) -> Generator[Any, None, TrajectoryGroup]:
        """`await group` runs its pending rollouts concurrently and returns the group."""
        return self._run_pending().__await__()

    async def _run_pending(self) -> TrajectoryGroup:
        pending, self._pending = self._pending, []
        if not pending:
            return self
        observer = current_observer.get()
        if observer is not None:
            observer.started(self, len(pending))
        for outcome in await gather_or_cancel([run_rollout(p, observer) for p in pending]):
            if isinstance(outcome, Trajectory):
                self.trajectories.append(outcome)
            else:
                self.exceptions.append(outcome)
        return self

    def log(self, message: str) -> None:
        """Append a line to this group's logs."""
        self.logs.append(message)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    def __repr__(self) -> str:
        return (
            f"TrajectoryGroup({len(self.trajectories)} trajectories, "
            f"{len(self.exceptions)} exceptions, {len(self._pending)} pending)"
        )

    def __copy__(self) -> TrajectoryGroup:
        # As ART: new lists (and dicts), the same trajectories.
        copied = TrajectoryGroup(
            self.trajectories, metadata=self.metadata, metrics=self.metrics, logs=self.logs
        )
        copied.exceptions = list(self.exceptions)
        copied._pending = list(self._pending)
        return copied

    def __deepcopy__(self, memo: dict[int, Any]) -> TrajectoryGroup:
        if self._pending:
            raise TypeError("a TrajectoryGroup with pending rollouts cannot be deep-copied")
        copied = TrajectoryGroup(
            copy.deepcopy(self.trajectories, memo),
            metadata=copy.deepcopy(self.metadata, memo),
            metrics=copy.deepcopy(self.metrics, memo),
            logs=list(self.logs),
        )
        copied.exceptions = copy.deepcopy(self.exceptions, memo)
        return copied

    @property
    def rewards(self) -> list[float]:
        """The rewards of the trajectories, in order."""
        return [t.reward for t in self.trajectories]


# --------------------------------------------------------------------------------- wire format


def group_payload(group: TrajectoryGroup) -> GroupPayload:
    """The group as the training API takes it (`art_core.wire`)."""
    if group._pending:
        raise InvalidTrajectoryError(
            "This TrajectoryGroup still holds rollouts that were never run: pass it through "
            "`await art.gather_trajectory_groups(...)` first."
        )
    return GroupPayload(
        trajectories=[trajectory_payload(t) for t in group.trajectories],
        exceptions=[f"{e.type}: {e.message}" for e in group.exceptions],
        metrics={key: float(value) for key, value in group.metrics.items()},
    )


def trajectory_payload(trajectory: Trajectory) -> TrajectoryPayload:
    """One trajectory as the training API takes it: messages and turn references per history.

    A choice is referenced by its completion id; any other assistant message (a plain dict, a
    choice served elsewhere) by its place in the history, for the backend to match by text.
    """
    histories = []
    context_assistant = 0
    for history in trajectory.histories():
        messages: list[dict[str, Any]] = []
        turns: list[TurnRef] = []
        for item in history.messages_and_choices:
            completion_id = _completion_id(item)
            message = _as_message(item)
            if completion_id is not None:
                turns.append(TurnRef(completion_id=completion_id, choice_index=_index(item)))
            elif message.get("role") == "assistant":
                context_assistant += 1
                turns.append(TurnRef(message_index=len(messages)))
            messages.append(message)
        histories.append(HistoryPayload(messages=messages, tools=history.tools, turns=turns))
    return TrajectoryPayload(
        id=trajectory.id,
        reward=trajectory.reward,
        metrics={key: float(value) for key, value in trajectory.metrics.items()},
        metadata=_jsonable(trajectory.metadata),
        logs=list(trajectory.logs),
        histories=histories,
        context_assistant_messages=context_assistant,
    )


def _completion_id(item: Any) -> str | None:
    """Our backend's id on a choice: an OpenAI `Choice` keeps it as an extra field, a LiteLLM
    `Choices` in `provider_specific_fields` (where LiteLLM puts fields it does not know)."""
    if isinstance(item, dict):
        return None
    extra = getattr(item, "model_extra", None) or {}
    value = extra.get("completion_id")
    if not isinstance(value, str):
        provider_fields = getattr(item, "provider_specific_fields", None)
        if isinstance(provider_fields, dict):
            value = provider_fields.get("completion_id")
    return value if isinstance(value, str) else None


def _index(item: Any) -> int:
    index = getattr(item, "index", 0)
    return index if isinstance(index, int) and index >= 0 else 0


def _full_message(item: Any) -> dict[str, Any]:
    """A message dict as given, or a choice's message with every field set (for logging)."""
    if isinstance(item, dict):
        return dict(item)
    message = getattr(item, "message", None)
    if message is None and isinstance(getattr(item, "text", None), str):
        return {"role": "assistant", "content": item.text}  # a CompletionChoice: plain text
    if message is None:
        raise InvalidTrajectoryError(
            f"messages_and_choices holds a {type(item).__name__}: use message dicts or the "
            "`Choice` objects of a chat completion (`response.choices[0]`), or of a completion "
            "(`client.completions.create(...).choices[0]`)."
        )
    if isinstance(message, dict):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        dumped = dump(exclude_none=True)
        return dict(dumped) if isinstance(dumped, dict) else {}
    return {
        key: getattr(message, key)
        for key in ("role", "content", "tool_calls")
        if getattr(message, key, None) is not None
    }


def _as_message(item: Any) -> dict[str, Any]:
    """The conversation turn of an item: a dict as given (it needs a role), a choice's message
    reduced to role, content and tool calls."""
    if isinstance(item, dict):
        if "role" not in item:
            raise InvalidTrajectoryError(f"A message dict needs a 'role': {item!r:.200}")
        return item
    full = _full_message(item)
    message = {key: value for key, value in full.items() if key in ("content", "tool_calls")}
    # A LiteLLM message may carry `tool_calls: []` and other fields OpenAI's has not.
    if not message.get("tool_calls"):
        message.pop("tool_calls", None)
    return {"role": full.get("role") or "assistant", **message}


def _plain_message(item: Any) -> dict[str, Any]:
    """ART's `messages()` form: a copy; content "" where it is None or missing."""
    message = dict(_as_message(item))
    if message.get("content") is None:
        message["content"] = ""
    return message


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
