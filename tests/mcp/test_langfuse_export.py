"""An MCP agent's runs, scored by RULER, exported to Langfuse: tool calls become tool spans.

The policy is scripted (an OpenAI-compatible server on 127.0.0.1), so its turns are foreign
completions (no record on our backend): they are exported with what the trajectory knows.
"""

from __future__ import annotations

import pytest

import art_core as art
import art_mcp
from art_core.trackers.langfuse import LangfuseObserver
from art_core.trackers.langfuse._trace import trace_id_for
from examples.mcp_servers.inventory_server import create_server
from tests.support.langfuse_receiver import (
    LangfuseReceiver,
    exporter,
    langfuse_receiver,
    langfuse_receiver_server,
)
from tests.support.scripted_judge import Reply, call, scores_json

__all__ = ["exporter", "langfuse_receiver", "langfuse_receiver_server"]


async def test_mcp_tool_calls_and_ruler_scores_reach_langfuse(
    policy, judge_model, tiny_model, exporter, langfuse_receiver: LangfuseReceiver
):
    scripted, policy_model = policy
    scripted.queue(
        call("search_items", {"query": "tea"}),
        call("complete_task", {"summary": "listed the teas"}),
        Reply("I do not know."),
        scores_json(0.9, 0.1, explanation="searched before answering"),
    )
    server = art_mcp.McpServer.from_object(create_server())
    task = "Which teas do we sell?"
    runs = [await art_mcp.rollout(policy_model, server, task) for _ in range(2)]
    scored = await art.ruler_score_group(art.TrajectoryGroup(runs), judge_model, cache=False)
    assert scored is not None

    tiny_model.observers = [LangfuseObserver(exporter)]
    await tiny_model.log([scored], split="val")
    assert exporter.flush(timeout=30)

    searched = scored.trajectories[0]
    trace_id = trace_id_for(searched.id)
    root, *children = langfuse_receiver.traces()[trace_id]
    kinds = [(span.type, span.name) for span in children]
    assert kinds == [
        ("generation", "chat completion"),
        ("tool", "search_items"),
        ("generation", "chat completion"),
        ("tool", "complete_task"),
    ]
    first_call, search, _, complete = children
    assert search.attribute_json("langfuse.observation.input") == {"query": "tea"}
    assert "tea" in search.attributes["langfuse.observation.output"].lower()
    assert search.metadata("answered") is True and search.metadata("called_by") == (
        first_call.span_id
    )
    assert complete.metadata("answered") is False  # the run ended on it: no tool message
    # A foreign completion: no record, so no usage or model, but its input and output.
    assert "langfuse.observation.usage_details" not in first_call.attributes
    assert first_call.attribute_json("langfuse.observation.input")[-1]["content"] == task
    assert root.attributes["langfuse.observation.input"] == task
    assert root.trace_metadata("scenario") == task
    scores = langfuse_receiver.scores_of(trace_id)
    assert scores["reward"]["value"] == pytest.approx(0.9)
    assert scores["ruler_score"]["value"] == pytest.approx(0.9)
    assert scores["ruler_score"]["comment"] == "searched before answering"
