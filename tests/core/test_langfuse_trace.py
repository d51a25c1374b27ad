"""A trajectory as a Langfuse trace: ids, the tree, tool pairing, timing, scores (pure code)."""

from __future__ import annotations

import pytest
from openai.types.chat.chat_completion import Choice

import art_core as art
from art_core.trackers.langfuse._trace import (
    TraceContext,
    completion_ids,
    observation_id_for,
    trace_from_trajectory,
    trace_id_for,
)

CONTEXT = TraceContext(project="shop", model="agent", step=3, split="train", group=1, advantage=0.5)
NOW = 1_800_000_000.0


def choice(content: str | None = None, *, calls=(), completion_id: str | None = None) -> Choice:
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in calls
        ]
    data = {"index": 0, "finish_reason": "tool_calls" if calls else "stop", "message": message}
    if completion_id:
        data["completion_id"] = completion_id
    return Choice.model_validate(data)


def record(completion_id: str, started: float, done: float, **request) -> dict:
    return {
        "id": completion_id,
        "started_at": started,
        "recorded_at": done,
        "created": int(started),
        "model": "agent@3",
        "rollout_id": "rollout-1",
        "request": {
            "model": "agent@3",
            "messages": [{"role": "user", "content": "exact prompt"}],
            "temperature": 1.0,
            "max_tokens": 32,
            **request,
        },
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        "choices": [],
    }


def tool_agent_trajectory() -> art.Trajectory:
    """Two parallel calls answered by tool messages, then a final call left unanswered."""
    return art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You run a shop."},
            {"role": "user", "content": "Hours in Paris and Lyon?"},
            choice(
                calls=[("c1", "hours", '{"city": "Paris"}'), ("c2", "hours", '{"city": "Lyon"}')],
                completion_id="cmpl-1",
            ),
            {"role": "tool", "tool_call_id": "c2", "content": "Lyon: 10-17"},
            {"role": "tool", "tool_call_id": "c1", "content": "Paris: 9-18"},
            choice(calls=[("c3", "complete_task", "{not json")], completion_id="cmpl-2"),
        ],
        reward=0.75,
        metrics={"ruler_score": 0.8, "tool_calls": 2},
        metadata={"scenario": "Hours in Paris and Lyon?"},
        logs=["RULER: answered both cities"],
    )


def test_the_trace_id_is_langfuses_create_trace_id_of_the_trajectory_id():
    langfuse = pytest.importorskip("langfuse")
    assert trace_id_for("traj-123") == langfuse.Langfuse.create_trace_id(seed="traj-123")
    assert len(observation_id_for(trace_id_for("x"), "run")) == 16


def test_the_same_trajectory_gives_the_same_ids_every_time():
    records = {"cmpl-1": record("cmpl-1", 100.0, 101.0), "cmpl-2": record("cmpl-2", 102.0, 103.0)}
    trajectory = tool_agent_trajectory()
    first = trace_from_trajectory(trajectory, CONTEXT, records, now=NOW)
    again = trace_from_trajectory(trajectory.model_copy(), CONTEXT, records, now=NOW + 60)
    assert first.trace_id == again.trace_id
    assert [o.id for o in first.observations] == [o.id for o in again.observations]
    assert [s.id for s in first.scores] == [s.id for s in again.scores]


def test_each_call_is_a_generation_and_each_tool_call_a_tool_paired_with_its_answer():
    records = {"cmpl-1": record("cmpl-1", 100.0, 101.0), "cmpl-2": record("cmpl-2", 102.0, 103.0)}
    trace = trace_from_trajectory(tool_agent_trajectory(), CONTEXT, records, now=NOW)
    root, *children = trace.observations
    assert root.type == "span" and root.parent_id is None
    assert all(o.parent_id == root.id for o in children)
    assert [(o.type, o.name) for o in children] == [
        ("generation", "chat completion"),
        ("tool", "hours"),
        ("tool", "hours"),
        ("generation", "chat completion"),
        ("tool", "complete_task"),
    ]
    first, paris, lyon, _, done = children
    assert (paris.input, paris.output) == ({"city": "Paris"}, "Paris: 9-18")
    assert (lyon.input, lyon.output) == ({"city": "Lyon"}, "Lyon: 10-17")
    assert paris.metadata["called_by"] == first.id and paris.metadata["answered"] is True
    assert done.input == "{not json" and done.metadata["answered"] is False
    assert root.input == "Hours in Paris and Lyon?"
    assert root.output["tool_calls"][0]["function"]["name"] == "complete_task"


def test_a_recorded_call_carries_the_exact_request_model_parameters_usage_and_latency():
    records = {"cmpl-1": record("cmpl-1", 100.0, 101.5, response_format={"type": "json_object"})}
    trace = trace_from_trajectory(tool_agent_trajectory(), CONTEXT, records, now=NOW)
    generation = trace.observations[1]
    assert generation.input == [{"role": "user", "content": "exact prompt"}]
    assert generation.model == "agent@3"
    assert generation.model_parameters == {
        "temperature": 1.0,
        "max_tokens": 32,
        "response_format": '{"type":"json_object"}',
    }
    assert generation.usage == {"input": 11, "output": 5, "total": 16}
    assert (generation.start, generation.end) == (100.0, 101.5)
    assert generation.metadata["latency_seconds"] == 1.5
    assert generation.metadata["completion_id"] == "cmpl-1"
    assert generation.metadata["rollout_id"] == "rollout-1"


def test_a_tool_runs_from_the_call_that_asked_to_the_next_call():
    records = {"cmpl-1": record("cmpl-1", 100.0, 101.0), "cmpl-2": record("cmpl-2", 104.0, 105.0)}
    trace = trace_from_trajectory(tool_agent_trajectory(), CONTEXT, records, now=NOW)
    root, _, paris, lyon, _, done = trace.observations
    assert (paris.start, paris.end) == (101.0, 104.0) == (lyon.start, lyon.end)
    assert paris.metadata["timing"] == "inferred"
    assert done.start >= 105.0 and done.end == done.start  # no later call: no duration known
    assert (root.start, root.end) == (100.0, done.end)


def test_without_records_a_call_is_exported_with_what_is_known_and_counted():
    trace = trace_from_trajectory(tool_agent_trajectory(), CONTEXT, {}, now=NOW)
    generation = trace.observations[1]
    assert trace.missing_records == 2
    assert generation.usage is None and generation.model is None
    assert generation.input[-1] == {"role": "user", "content": "Hours in Paris and Lyon?"}
    assert generation.metadata["record"].startswith("missing")
    starts = [o.start for o in trace.observations[1:]]
    assert starts == sorted(starts) and all(s >= NOW for s in starts)
    assert generation.metadata["timing"] == "unknown"


def test_plain_dict_assistant_messages_and_foreign_choices_are_generations_not_trained():
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
            choice("from another provider"),
        ]
    )
    trace = trace_from_trajectory(trajectory, CONTEXT, {}, now=NOW)
    dict_turn, foreign = trace.observations[1:]
    assert dict_turn.name == "assistant message" and dict_turn.metadata["trained"] is False
    assert "context" in dict_turn.metadata["source"]
    assert foreign.output == {"role": "assistant", "content": "from another provider"}
    assert foreign.metadata["trained"] is False and trace.missing_records == 0


def test_a_tool_message_without_its_call_is_still_a_tool_observation():
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "ghost", "name": "lookup", "content": "42"},
        ]
    )
    [tool] = trace_from_trajectory(trajectory, CONTEXT, {}, now=NOW).observations[1:]
    assert (tool.type, tool.name, tool.output) == ("tool", "lookup", "42")
    assert tool.metadata["paired"] is False


def test_additional_histories_are_spans_under_the_run_with_their_own_calls():
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "plan"}, choice("the plan")],
        additional_histories=[
            art.History(messages_and_choices=[{"role": "user", "content": "sub"}, choice("x")])
        ],
    )
    root, main, branch, sub_call = trace_from_trajectory(
        trajectory, CONTEXT, {}, now=NOW
    ).observations
    assert (branch.type, branch.name, branch.parent_id) == ("span", "history 1", root.id)
    assert main.parent_id == root.id and sub_call.parent_id == branch.id


def test_reward_and_ruler_score_are_scores_and_the_context_is_metadata_and_tags():
    trajectory = tool_agent_trajectory()
    trace = trace_from_trajectory(trajectory, CONTEXT, {}, now=NOW)
    reward, ruler = trace.scores
    assert (reward.name, reward.value) == ("reward", 0.75)
    assert (ruler.name, ruler.value, ruler.comment) == ("ruler_score", 0.8, "answered both cities")
    assert trace.session_id == "shop/agent"
    assert trace.tags == ["split:train", "step:3"]
    assert trace.metadata == {
        "project": "shop",
        "model": "agent",
        "step": 3,
        "split": "train",
        "trajectory_id": trajectory.id,
        "reward": 0.75,
        "group": 1,
        "advantage": 0.5,
        "scenario": "Hours in Paris and Lyon?",
    }
    assert trace.root.metadata["metrics"] == {"ruler_score": 0.8, "tool_calls": 2}
    assert trace.root.metadata["logs"] == ["RULER: answered both cities"]


def test_a_long_scenario_is_cut_in_the_trace_metadata_but_whole_on_the_run():
    trajectory = art.Trajectory(metadata={"scenario": "x" * 500})
    trace = trace_from_trajectory(trajectory, CONTEXT, {}, now=NOW)
    assert len(trace.metadata["scenario"]) == 180 and trace.metadata["scenario"].endswith("...")
    assert trace.root.metadata["scenario"] == "x" * 500
    assert [s.name for s in trace.scores] == ["reward"]  # no RULER score without one


def test_completion_ids_lists_every_choice_of_every_history():
    trajectory = art.Trajectory(
        messages_and_choices=[choice("a", completion_id="c-1"), {"role": "user", "content": "?"}],
        additional_histories=[art.History(messages_and_choices=[choice("b", completion_id="c-2")])],
    )
    assert completion_ids(trajectory) == ["c-1", "c-2"]
