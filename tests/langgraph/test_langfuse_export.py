"""A LangGraph agent's run exported to Langfuse: every model call a generation with its record,
every tool call a tool span paired with the ToolMessage that answered it."""

from __future__ import annotations

import warnings

from langchain_core.tools import tool

import art_core as art
import art_langgraph
from art_core.trackers.langfuse import LangfuseObserver
from art_core.trackers.langfuse._trace import trace_id_for
from tests.support.langfuse_receiver import (
    LangfuseReceiver,
    exporter,
    langfuse_receiver,
    langfuse_receiver_server,
)

__all__ = ["exporter", "langfuse_receiver", "langfuse_receiver_server"]


async def test_a_react_agent_run_is_a_trace_of_generations_and_paired_tool_spans(
    model: art.TrainableModel, exporter: art.LangfuseExporter, langfuse_receiver: LangfuseReceiver
):
    @tool
    def lookup(city: str) -> str:
        """The opening hours of our shop in a city."""
        return f"{city}: 9-18"

    # Forced tool calls (grammar-enforced): even the tiny model calls the tool, every turn.
    llm = art_langgraph.TrainableChatModel(model, max_tokens=40, temperature=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's move to langchain.agents
        from langgraph.prebuilt import create_react_agent

        agent = create_react_agent(llm.bind_tools([lookup], tool_choice="required"), [lookup])
    async with art_langgraph.rollout(model, scenario="hours in Paris?") as r:
        await agent.ainvoke({"messages": [("user", "hours in Paris?")]}, {"recursion_limit": 4})
        r.reward = 1.0

    model.observers = [LangfuseObserver(exporter)]
    await model.log([art.TrajectoryGroup([r.trajectory])])
    assert exporter.flush(timeout=30)

    root, *children = langfuse_receiver.traces()[trace_id_for(r.trajectory.id)]
    generations = [s for s in children if s.type == "generation"]
    tools = [s for s in children if s.type == "tool"]
    tool_messages = [m for m in r.trajectory.messages() if m["role"] == "tool"]
    assert len(generations) >= 2 and len(tools) >= len(tool_messages) >= 1
    for generation in generations:  # each call from its record on the server
        assert generation.attributes["langfuse.observation.model.name"] == f"{model.name}@0"
        assert generation.attribute_json("langfuse.observation.usage_details")["output"] > 0
        parameters = generation.attribute_json("langfuse.observation.model.parameters")
        assert parameters["tool_choice"] == "required"
        assert parameters.get("max_completion_tokens", parameters.get("max_tokens")) == 40
        assert generation.metadata("tools") == ["lookup"]
        assert generation.metadata("timing") == "recorded"
    answered = [t for t in tools if t.metadata("answered")]
    assert [t.attributes["langfuse.observation.output"] for t in answered] == [
        m["content"] for m in tool_messages
    ]
    by_id = {g.span_id: g for g in generations}
    for span in answered:
        assert span.name == "lookup" and "city" in span.attribute_json("langfuse.observation.input")
        caller = by_id[span.metadata("called_by")]
        assert span.start_ns == caller.end_ns  # the tool ran after the call that asked for it
        assert span.end_ns == min(g.start_ns for g in generations if g.start_ns > caller.end_ns)
    assert root.attributes["langfuse.observation.input"] == "hours in Paris?"
    assert langfuse_receiver.scores_of(trace_id_for(r.trajectory.id))["reward"]["value"] == 1.0
