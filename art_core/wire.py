"""The training API's wire: one definition of every request, for both sides.

`art_core` builds these (`RemoteBackend`), the server validates the same classes
(`/v1/training/...`); pure pydantic, no torch. The settings are `art_core.types`' own
(`TrainConfig`, `LoRAConfig`, `TrainSFTConfig`): one definition of every field, range and
default. Unknown fields are refused (a misspelt option must not be silently ignored), every
number has its range, the wire's own integers and booleans are strict (`"step": true` is no step
1, `"promote": "no"` no refusal) and its dictionaries of metrics and details are bounded
(`MAX_METRICS`, `MAX_DETAILS`), so a bad request is an error that names the field before
anything trains.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from art_core.names import check_name, check_split
from art_core.types import LoRAConfig, TrainConfig, TrainSFTConfig

__all__ = [
    "SEED_RANGE",
    "DeleteCheckpointsRequest",
    "ForkFrom",
    "GroupPayload",
    "HistoryPayload",
    "LogRequest",
    "PromoteRequest",
    "RegisterRequest",
    "SFTExample",
    "SFTRequest",
    "TrainRequest",
    "TrajectoryPayload",
    "TurnRef",
    "finite_reward",
]

# A seed is a signed 64-bit integer: OpenAI's range for `seed` (its OpenAPI description), and
# what a training request's seed may be (torch.manual_seed takes 64 bits).
SEED_RANGE = (-(2**63), 2**63 - 1)


def finite_reward(value: float) -> float:
    """The one reward rule, of a `Trajectory` and of the wire: a finite number."""
    if not math.isfinite(value):
        raise ValueError(f"reward must be a finite number, got {value}")
    return value


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# Content parts an SFT message may hold, as serving reads them: part type -> key of its text.
TEXT_PARTS = {"text": "text", "refusal": "refusal"}
# Each served step is one LoRA adapter in the engine's memory (and a vLLM LoRA slot).
MAX_SERVED_STEPS = 16
# Bounds no real client meets (a train step's client counts and a gate's numbers are a handful;
# a gate's details are five): each name becomes a key of every history row, summed per step and
# served back by GET .../history; 50,000 names held the server's loop a second.
MAX_METRICS = 1_000  # names in one metrics dictionary
MAX_METRIC_NAME = 256  # characters of one metric name or details key
MAX_DETAILS = 100  # keys of a promotion's details
MAX_DETAIL_CHARACTERS = 16_384  # characters of one details string (an evaluation's error)
# The promotion row's own fields: a details key may not replace them (the store's `recorded_at`
# least of all).
PROMOTION_ROW_FIELDS = frozenset(
    {"recorded_at", "type", "step", "promoted", "promoted_step", "metrics"}
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _bounded_names(kind: str, names: dict[str, Any], most: int) -> None:
    if len(names) > most:
        raise ValueError(
            f"holds {len(names):,} {kind}, more than the {most:,} this server takes in one "
            "request; send fewer (aggregate them, or log them as trajectory metrics)"
        )
    if long := next((name for name in names if len(name) > MAX_METRIC_NAME), None):
        raise ValueError(
            f"{kind} {long[:40]!r}... is {len(long):,} characters long, more than the "
            f"{MAX_METRIC_NAME} a name may have; shorten it"
        )


def _bounded_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """At most MAX_METRICS names of at most MAX_METRIC_NAME characters."""
    _bounded_names("metric names", metrics, MAX_METRICS)
    return metrics


Metrics = Annotated[dict[str, float], AfterValidator(_bounded_metrics)]


class _ModelName(_Strict):
    """A model of this server's --path, by project and name: both pass the one name rule
    (they become folders, so a `..` or a slash must never reach the filesystem)."""

    project: str
    name: str

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        return check_name(value, "project name")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "model name")


class ForkFrom(_ModelName):
    step: StrictInt | None = Field(None, ge=0)  # None: the source's latest step


class RegisterRequest(_ModelName):
    base_model: str
    lora: LoRAConfig = LoRAConfig()
    fork_from: ForkFrom | None = None
    seed: StrictInt = Field(0, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    # How many of its newest steps the engine keeps loaded (`name@step`): rollouts that started
    # on an older step must still reach it. A pipeline trainer asks for max_steps_off_policy + 1.
    served_steps: StrictInt = Field(2, ge=1, le=MAX_SERVED_STEPS)
    # A new model's step 0 from a PEFT adapter folder on the server's machine (ART's warm start
    # from an SFT LoRA: `base_model="/path/to/adapter"`); a model that exists resumes instead.
    init_adapter: str | None = Field(None, min_length=1, max_length=4096)


class TurnRef(_Strict):
    """A trainable assistant turn: a choice of a completion this server recorded, by its id, or
    an assistant message without one (`message_index` in the history), matched by its text."""

    completion_id: str | None = None
    choice_index: StrictInt = Field(0, ge=0)
    message_index: StrictInt | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_reference(self) -> TurnRef:
        if (self.completion_id is None) == (self.message_index is None):
            raise ValueError("a turn names either completion_id or message_index")
        return self


class HistoryPayload(_Strict):
    """One conversation of a trajectory: its messages (for logs) and its trainable turns in order."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    turns: list[TurnRef] = Field(default_factory=list)

    @model_validator(mode="after")
    def _turns_in_messages(self) -> HistoryPayload:
        for turn in self.turns:
            index = turn.message_index
            if index is not None and (
                index >= len(self.messages) or self.messages[index].get("role") != "assistant"
            ):
                raise ValueError(f"turn message_index {index} is not an assistant message")
        return self


class TrajectoryPayload(_Strict):
    id: str
    reward: float
    metrics: Metrics = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    histories: list[HistoryPayload] = Field(default_factory=list)
    context_assistant_messages: StrictInt = Field(0, ge=0)  # assistant turns without an id: matched

    @field_validator("reward")
    @classmethod
    def _finite_reward(cls, value: float) -> float:
        return finite_reward(value)


class GroupPayload(_Strict):
    trajectories: list[TrajectoryPayload]
    exceptions: list[str] = Field(default_factory=list)  # rollouts that raised: counted
    metrics: Metrics = Field(default_factory=dict)  # group-level: summed over groups


class TrainRequest(_Strict):
    groups: list[GroupPayload]
    config: TrainConfig = TrainConfig()
    # Counted by the client before sending (e.g. groups an `after_each` judge dropped).
    client_metrics: Metrics = Field(default_factory=dict)
    # False: the new step is served as `name@N` but the plain name stays on the promoted step
    # (a promotion gate evaluates it first, then calls `/promote`).
    promote: StrictBool = True
    # Train from this step's checkpoint rather than the latest (a gate's train_from="promoted").
    train_from_step: StrictInt | None = Field(None, ge=0)


class PromoteRequest(_Strict):
    """A promotion gate's verdict on `step`: promote=True points the plain name at it; False
    records that it was refused (the plain name stays). Either way one "promotion" history row
    holds `metrics` (the gate's numbers) and `details` (its metric, best so far, an error), the
    details as the row's own fields: a key of the row itself (`PROMOTION_ROW_FIELDS`) is refused."""

    step: StrictInt = Field(ge=0)
    promote: StrictBool = True
    metrics: Metrics = Field(default_factory=dict)
    details: dict[str, str | int | bool | None] = Field(default_factory=dict)

    @field_validator("details")
    @classmethod
    def _bounded_details(cls, value: dict[str, Any]) -> dict[str, Any]:
        _bounded_names("details keys", value, MAX_DETAILS)
        if reserved := sorted(PROMOTION_ROW_FIELDS & set(value)):
            raise ValueError(
                f"{', '.join(reserved)} {'is a field' if len(reserved) == 1 else 'are fields'} "
                "of the promotion row itself, which details cannot replace; rename "
                f"{'it' if len(reserved) == 1 else 'them'}"
            )
        for key, text in value.items():
            if isinstance(text, str) and len(text) > MAX_DETAIL_CHARACTERS:
                raise ValueError(
                    f"details[{key!r}] is {len(text):,} characters long, more than the "
                    f"{MAX_DETAIL_CHARACTERS:,} a details string may have; shorten it"
                )
        return value

    @field_validator("metrics")
    @classmethod
    def _finite_metrics(cls, value: dict[str, float]) -> dict[str, float]:
        if bad := sorted(key for key, number in value.items() if not math.isfinite(number)):
            raise ValueError(f"metrics must be finite numbers: {', '.join(bad)} are not")
        return value


def _sft_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message the template can render: a known role, content as one string."""
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise ValueError(f"unknown role {role!r}: use one of {', '.join(CHAT_ROLES)}")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get(TEXT_PARTS[kind]) if kind in TEXT_PARTS else None
            if not isinstance(text, str):
                raise ValueError(
                    'content parts must be text parts, {"type": "text", "text": "..."}; '
                    f"got {part!r}"
                )
            texts.append(text)
        # Joined as serving joins them, so SFT trains on the tokens serving would render.
        return {**message, "content": "\n".join(texts)}
    if content is None and role != "assistant":
        raise ValueError(f"a {role} message needs `content`")
    if content is not None and not isinstance(content, str):
        raise ValueError("content must be a string or a list of text parts")
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            _check_tool_calls(calls)
        if content is None and not calls:
            raise ValueError("an assistant message needs `content` or `tool_calls`")
    return message


def _check_tool_calls(calls: Any) -> None:
    """OpenAI's shape, which serving renders: [{"function": {"name": ..., "arguments": ...}}]."""
    if not isinstance(calls, list):
        raise ValueError("tool_calls must be a list")
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str | dict)
        ):
            raise ValueError(
                f'tool_calls[{index}] must be {{"type": "function", "function": {{"name": '
                f'"...", "arguments": "<JSON text>"}}}}; got {call!r}'
            )


def _sft_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool definition: {"type": "function", "function": {"name": ..., ...}}."""
    function = tool.get("function")
    if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
        raise ValueError(
            'a tool must be {"type": "function", "function": {"name": "...", "parameters": {...}}}'
        )
    return tool


class SFTExample(_Strict):
    messages: list[Annotated[dict[str, Any], AfterValidator(_sft_message)]] = Field(min_length=1)
    tools: list[Annotated[dict[str, Any], AfterValidator(_sft_tool)]] | None = None


class SFTRequest(_Strict):
    """Trajectories to imitate. `config.learning_rate` as a list is one rate per batch, so its
    length must be the number of batches (checked by the service, which resolves "auto")."""

    trajectories: list[SFTExample]
    config: TrainSFTConfig = TrainSFTConfig()


TRACKER_ROW_FIELDS = frozenset({"tracker", "run_id", "url", "how_to_open"})


class LogRequest(_Strict):
    """`model.log(groups, split, metrics=..., step=...)`: groups and/or metrics at a step."""

    groups: list[GroupPayload] = Field(default_factory=list)
    split: str = "val"
    metrics: Metrics = Field(default_factory=dict)  # ART's: e.g. a TrainResult's
    step: StrictInt | None = Field(None, ge=0)  # None: the model's current step
    # An experiment tracker's run of the model, recorded as one "tracker" history row (instead
    # of a "log" row): {"tracker", "run_id", "url" (online), "how_to_open" (offline)}.
    tracker: dict[str, str | None] | None = None

    @field_validator("split")
    @classmethod
    def _split(cls, value: str) -> str:
        return check_split(value)

    @field_validator("tracker")
    @classmethod
    def _tracker(cls, value: dict[str, str | None] | None) -> dict[str, str | None] | None:
        if value is not None and (set(value) - TRACKER_ROW_FIELDS or not value.get("tracker")):
            raise ValueError(f"tracker names its 'tracker' and only {sorted(TRACKER_ROW_FIELDS)}")
        return value


class DeleteCheckpointsRequest(_Strict):
    """Either keep the latest and the best step by a logged metric (ART's form), or delete
    exactly `steps` (a retention strategy's choice; the latest step is never deleted). Either
    form keeps the steps in `keep` (a client's adapter leases): `steps` skips them, and the
    answer names them in `held`."""

    # First, so that the other form's fields, when given beside it, are refused by name.
    steps: list[StrictInt] | None = None
    keep: list[StrictInt] = []
    best_checkpoint_metric: str = "val/reward"
    maximize: StrictBool = True

    @field_validator("best_checkpoint_metric", "maximize")
    @classmethod
    def _one_form(cls, value: Any, info: ValidationInfo) -> Any:
        # Runs only for a field given (defaults are not validated): the other form's.
        if info.data.get("steps") is not None:
            raise ValueError(
                f"give either steps (delete exactly those) or {info.field_name} (keep the "
                "latest and the best), not both"
            )
        return value


class HoldStepRequest(_Strict):
    """Take (or, with `release`, give back) a hold on a step of a model (an adapter lease): a
    held step stays served as `<name>@<step>` beyond the served window, and its checkpoint is
    not deleted, until every hold on it is given back (or the server restarts)."""

    step: StrictInt = Field(ge=0)
    release: StrictBool = False
