"""A trajectory as a Langfuse trace: pure functions, no I/O and no langfuse import.

One trajectory is one trace. Its root observation (the run) holds one generation per LLM
call (input messages, output, model `name@step`, sampling parameters, token usage, start and
end) and one tool observation per tool call, paired with the tool message that answered it.
Additional histories (sub-agents, branches) are spans under the root with their own calls.
The reward and the RULER score are trace scores. Every id is derived from the trajectory id,
so exporting the same trajectory again writes the same trace, observations and scores.

A call's facts come from its completion record on our backend (`records`, by completion id):
the exact request, the usage, and the times it arrived and finished. A `Choice` without a
record and a plain-dict assistant message are exported with what the trajectory knows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from art_core.trajectories import Trajectory, _as_message, _completion_id, _jsonable

# Request fields that are not sampling parameters (the messages and tools are the input).
_NOT_PARAMETERS = {"messages", "tools", "model", "stream", "stream_options", "metadata", "user"}
# Langfuse keeps propagated trace metadata values and names up to 200 characters.
_TRACE_VALUE_LIMIT = 200


@dataclass(frozen=True)
class TraceContext:
    """Where a trajectory comes from: the training run, the step that sampled it, its group."""

    project: str
    model: str
    step: int
    split: str
    group: int | None = None
    advantage: float | None = None


@dataclass
class Observation:
    """One node of the trace: the run (span), an LLM call (generation) or a tool call (tool)."""

    id: str
    parent_id: str | None
    type: Literal["span", "generation", "tool"]
    name: str
    start: float | None = None  # seconds since the epoch; None until laid out
    end: float | None = None
    input: Any = None
    output: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    model_parameters: dict[str, Any] | None = None
    usage: dict[str, int] | None = None


@dataclass(frozen=True)
class Score:
    """A trace score (the reward, the RULER score); its id makes a re-export an update."""

    id: str
    name: str
    value: float
    comment: str | None = None
    timestamp: float | None = None  # the end of the run, so a re-export sends the same score


@dataclass
class TraceData:
    """Everything one trace needs: ids, trace attributes, observations (root first), scores."""

    trace_id: str
    name: str
    session_id: str
    tags: list[str]
    metadata: dict[str, Any]
    observations: list[Observation]
    scores: list[Score]
    missing_records: int = 0

    @property
    def root(self) -> Observation:
        return self.observations[0]


def trace_id_for(trajectory_id: str) -> str:
    """32 hex characters from the trajectory id: Langfuse's `create_trace_id(seed=...)`."""
    return hashlib.sha256(trajectory_id.encode("utf-8")).digest()[:16].hex()


def observation_id_for(trace_id: str, path: str) -> str:
    """16 hex characters (an OpenTelemetry span id) for one place in the trace."""
    digest = hashlib.sha256(f"{trace_id}/{path}".encode()).digest()
    return digest[:8].hex() if any(digest[:8]) else "0000000000000001"


def completion_ids(trajectory: Trajectory) -> list[str]:
    """The completion ids of every `Choice` in the trajectory (the records an export needs)."""
    return [
        completion_id
        for history in trajectory.histories()
        for item in history.messages_and_choices
        if (completion_id := _completion_id(item)) is not None
    ]


def trace_from_trajectory(
    trajectory: Trajectory,
    context: TraceContext,
    records: Mapping[str, dict[str, Any]],
    *,
    now: float,
) -> TraceData:
    """The trace of one trajectory; `now` places calls whose times are unknown."""
    trace_id = trace_id_for(trajectory.id)
    root = Observation(
        id=observation_id_for(trace_id, "run"),
        parent_id=None,
        type="span",
        name=f"{context.model} {context.split} rollout",
    )
    observations = [root]
    missing = 0
    for index, history in enumerate(trajectory.histories()):
        parent = root
        if index > 0:
            parent = Observation(
                id=observation_id_for(trace_id, f"h{index}"),
                parent_id=root.id,
                type="span",
                name=f"history {index}",
                metadata={"history": index},
            )
            observations.append(parent)
        calls, missed = _history_observations(
            history.messages_and_choices, history.tools, records, trace_id, index, parent.id
        )
        missing += missed
        _lay_out(calls, now)
        observations += calls
        if index > 0:
            _span_children(parent, calls, now)
    _span_children(root, observations[1:], now)

    main = [_as_message(item) for item in trajectory.messages_and_choices]
    scenario = trajectory.metadata.get("scenario")
    root.input = scenario if scenario is not None else _first_user_text(main)
    root.output = _last_assistant(main)
    trace_metadata = _trace_metadata(trajectory, context)
    root.metadata = {
        **trace_metadata,
        "scenario": _jsonable(scenario),
        "metrics": dict(trajectory.metrics),
        "trajectory_metadata": _jsonable(
            {k: v for k, v in trajectory.metadata.items() if k != "langfuse_trace_url"}
        ),
        "logs": list(trajectory.logs),
        "additional_histories": len(trajectory.additional_histories),
        "missing_records": missing,
    }
    return TraceData(
        trace_id=trace_id,
        name=root.name,
        session_id=f"{context.project}/{context.model}"[:_TRACE_VALUE_LIMIT],
        tags=[f"split:{context.split}", f"step:{context.step}"],
        metadata=trace_metadata,
        observations=observations,
        scores=_scores(trajectory, trace_id, root.end),
        missing_records=missing,
    )


# ------------------------------------------------------------------------------ observations


def _history_observations(
    items: list[Any],
    tools: list[dict[str, Any]] | None,
    records: Mapping[str, dict[str, Any]],
    trace_id: str,
    history: int,
    parent_id: str,
) -> tuple[list[Observation], int]:
    """Generations and tool calls of one conversation, in order; and how many records were
    missing."""
    observations: list[Observation] = []
    conversation: list[dict[str, Any]] = []
    open_calls: dict[str, Observation] = {}
    missing = 0
    for position, item in enumerate(items):
        message = _as_message(item)
        path = f"h{history}/{position}"
        if message.get("role") == "assistant":
            completion_id = _completion_id(item)
            record = records.get(completion_id) if completion_id else None
            missing += completion_id is not None and record is None
            generation = _generation(
                observation_id_for(trace_id, path), parent_id, item, message, record, conversation
            )
            if tools and record is None:
                generation.metadata["tools"] = _tool_names(tools)
            observations.append(generation)
            for number, call in enumerate(message.get("tool_calls") or []):
                asked = _tool_call(
                    observation_id_for(trace_id, f"{path}/{number}"), parent_id, call
                )
                asked.metadata["called_by"] = generation.id
                observations.append(asked)
                # A reused call id: the newer call is the one its tool message answers.
                if (earlier := open_calls.get(str(call.get("id")))) is not None:
                    earlier.metadata["answered"] = False
                open_calls[str(call.get("id"))] = asked
        elif message.get("role") == "tool":
            paired = open_calls.pop(str(message.get("tool_call_id")), None)
            tool = paired or Observation(
                id=observation_id_for(trace_id, path),
                parent_id=parent_id,
                type="tool",
                name=str(message.get("name") or "tool"),
                metadata={"tool_call_id": message.get("tool_call_id"), "paired": False},
            )
            if paired is None:  # a tool message no call of this history asked for
                observations.append(tool)
            tool.output = message.get("content")
            tool.metadata["answered"] = True
        conversation.append(message)
    for unanswered in open_calls.values():
        unanswered.metadata["answered"] = False  # e.g. a final `complete_task` call
    return observations, missing


def _generation(
    observation_id: str,
    parent_id: str,
    item: Any,
    message: dict[str, Any],
    record: dict[str, Any] | None,
    conversation: list[dict[str, Any]],
) -> Observation:
    completion_id = _completion_id(item)
    generation = Observation(
        id=observation_id,
        parent_id=parent_id,
        type="generation",
        name="chat completion",
        input=list(conversation),
        output=message,
        metadata={
            "completion_id": completion_id,
            # Trained on its exact tokens when it is our backend's Choice; a dict is context.
            "trained": completion_id is not None,
        },
    )
    if completion_id is None:
        generation.name = "assistant message" if isinstance(item, dict) else "chat completion"
        generation.metadata["source"] = (
            "message dict (context, not trained)"
            if isinstance(item, dict)
            else "Choice without a completion id (not served by this backend)"
        )
        return generation
    generation.metadata["choice_index"] = getattr(item, "index", 0)
    generation.metadata["finish_reason"] = getattr(item, "finish_reason", None)
    if record is None:
        generation.metadata["record"] = "missing (evicted, or served by another backend)"
        return generation
    request = record.get("request", {})
    generation.input = request.get("messages", generation.input)
    generation.model = record.get("model") or request.get("model")
    generation.model_parameters = {
        key: _parameter(value) for key, value in request.items() if key not in _NOT_PARAMETERS
    }
    usage = record.get("usage") or {}
    generation.usage = {
        name: int(usage[key])
        for name, key in (
            ("input", "prompt_tokens"),
            ("output", "completion_tokens"),
            ("total", "total_tokens"),
        )
        if isinstance(usage.get(key), int)
    }
    generation.start = record.get("started_at", record.get("created"))
    generation.end = record.get("recorded_at")
    if generation.start is not None and generation.end is not None:
        generation.metadata["latency_seconds"] = round(generation.end - generation.start, 6)
    if request.get("tools"):
        generation.metadata["tools"] = _tool_names(request["tools"])
    if record.get("rollout_id"):
        generation.metadata["rollout_id"] = record["rollout_id"]
    return generation


def _tool_call(observation_id: str, parent_id: str, call: dict[str, Any]) -> Observation:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        parsed = arguments  # the model's malformed arguments, as it wrote them
    return Observation(
        id=observation_id,
        parent_id=parent_id,
        type="tool",
        name=str(function.get("name") or "tool"),
        input=parsed,
        metadata={"tool_call_id": call.get("id"), "paired": True},
    )


def _lay_out(observations: list[Observation], now: float) -> None:
    """Give every observation a start and an end, in conversation order.

    Recorded calls keep their times. A tool call runs from the end of the call that asked for
    it to the start of the next call. Anything else unknown starts where the previous one
    ended (1 microsecond later, so the order survives sorting by time), with no duration.
    """
    known = [o.start for o in observations if o.start is not None]
    cursor = min(known) if known else now
    cursor_recorded = False  # whether the cursor is the recorded end of the previous call
    for index, observation in enumerate(observations):
        recorded = observation.start is not None
        if observation.start is None:
            if not (observation.type == "tool" and cursor_recorded):
                cursor += 1e-6
            observation.start = cursor
        if observation.end is None:
            observation.end = observation.start
            if observation.type == "tool":
                later = [o.start for o in observations[index + 1 :] if o.type == "generation"]
                if later and later[0] is not None and later[0] > observation.start:
                    observation.end = later[0]
        observation.metadata.setdefault(
            "timing",
            "recorded" if recorded else ("inferred" if observation.type == "tool" else "unknown"),
        )
        if observation.type != "tool":
            cursor, cursor_recorded = max(cursor, observation.end), recorded


def _span_children(span: Observation, children: list[Observation], now: float) -> None:
    starts = [c.start for c in children if c.start is not None]
    ends = [c.end for c in children if c.end is not None]
    span.start = min(starts) if starts else now
    span.end = max(ends) if ends else span.start


# -------------------------------------------------------------------------- trace attributes


def _trace_metadata(trajectory: Trajectory, context: TraceContext) -> dict[str, Any]:
    """Short, filterable trace metadata (Langfuse keeps propagated values to 200 chars)."""
    metadata: dict[str, Any] = {
        "project": context.project,
        "model": context.model,
        "step": context.step,
        "split": context.split,
        "trajectory_id": trajectory.id,
        "reward": trajectory.reward,
    }
    if context.group is not None:
        metadata["group"] = context.group
    if context.advantage is not None:
        metadata["advantage"] = context.advantage
    scenario = trajectory.metadata.get("scenario")
    if scenario is not None:
        text = scenario if isinstance(scenario, str) else json.dumps(_jsonable(scenario))
        # The whole scenario is on the root observation; the trace keeps a filterable prefix.
        metadata["scenario"] = text if len(text) <= 180 else text[:177] + "..."
    return metadata


def _scores(trajectory: Trajectory, trace_id: str, when: float | None) -> list[Score]:
    scores = [
        Score(
            id=f"{trace_id}-reward", name="reward", value=float(trajectory.reward), timestamp=when
        )
    ]
    ruler = trajectory.metrics.get("ruler_score")
    if isinstance(ruler, int | float) and not isinstance(ruler, bool) and math.isfinite(ruler):
        explanation = next(
            (line.removeprefix("RULER: ") for line in trajectory.logs if line.startswith("RULER:")),
            None,
        )
        scores.append(
            Score(
                id=f"{trace_id}-ruler_score",
                name="ruler_score",
                value=float(ruler),
                comment=explanation,
                timestamp=when,
            )
        )
    return scores


# ------------------------------------------------------------------------------------ helpers


def _parameter(value: Any) -> Any:
    """Langfuse model parameters are scalars or lists of strings; anything else as JSON."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [str((tool.get("function") or {}).get("name", "?")) for tool in tools]


def _first_user_text(messages: list[dict[str, Any]]) -> Any:
    return next((m.get("content") for m in messages if m.get("role") == "user"), None)


def _last_assistant(messages: list[dict[str, Any]]) -> Any:
    return next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
