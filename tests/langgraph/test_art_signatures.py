"""ART's own LangGraph signatures work unchanged: `init_chat_model(model.name, temperature=...)`
inside a rollout, and `wrap_rollout(model, fn)` where `fn` returns its (subclassed) Trajectory.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

import art_core as art
import art_langgraph

FAST = {"max_tokens": 3, "temperature": 1.0}


class AnswerTrajectory(art.Trajectory):
    """A user's trajectory subclass, as ART's examples write them (a field of its own)."""

    final_answer: str | None = None


def chat_graph(llm: Any) -> Any:
    """START -> agent -> END: one call of `llm` on the conversation so far."""

    async def agent(state: MessagesState) -> dict:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    return graph.compile()


async def art_style_rollout(model: art.TrainableModel, question: str) -> AnswerTrajectory:
    """A rollout written for ART: the chat model by name, the trajectory built and returned."""
    trajectory = AnswerTrajectory(
        reward=0.0,
        messages_and_choices=[],
        metrics={"answered": False},
        metadata={"question": question},
    )
    llm = art_langgraph.init_chat_model(model.name, temperature=1.0, max_tokens=3)
    result = await chat_graph(llm).ainvoke({"messages": [HumanMessage(question)]})
    trajectory.final_answer = result["messages"][-1].content
    trajectory.metrics["answered"] = True
    trajectory.reward = float(len(trajectory.final_answer or "") % 3)
    return trajectory


async def test_init_chat_model_by_name_in_a_wrapped_art_rollout(model: art.TrainableModel):
    trajectory = await art_langgraph.wrap_rollout(model, art_style_rollout)(model, "q marker-n")

    assert type(trajectory) is AnswerTrajectory  # the rollout's own object, fields kept
    assert trajectory.final_answer is not None
    assert trajectory.reward == float(len(trajectory.final_answer) % 3)
    assert trajectory.metrics["answered"] is True
    assert trajectory.metadata["question"] == "q marker-n"
    assert trajectory.metadata["rollout_id"]  # what the capture adds, beside the user's keys
    messages = trajectory.messages()
    assert messages[0]["content"] == "q marker-n"
    assert messages[-1]["content"] == trajectory.final_answer
    assert trajectory.messages_and_choices[-1].model_extra["completion_id"]


async def test_wrapped_art_rollouts_train(model: art.TrainableModel):
    wrapped = art_langgraph.wrap_rollout(model, art_style_rollout)
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(wrapped(model, f"q{k} marker-{k}") for _ in range(4)) for k in (1, 2)],
        show_progress=False,
    )
    for group in groups:  # rewards that differ, so every group trains
        for index, trajectory in enumerate(group.trajectories):
            assert isinstance(trajectory, AnswerTrajectory)
            trajectory.reward = float(index)
    result = await model.train(groups, learning_rate=1e-3)
    assert result.step == 1 and result.metrics["trained_tokens"] > 0
    assert result.metrics["dropped/unknown_completion"] == 0


async def test_the_prebuilt_react_agent_with_init_chat_model_by_name(model: art.TrainableModel):
    from langgraph.prebuilt import create_react_agent

    @tool
    def lookup(city: str) -> str:
        """The opening hours of our shop in a city."""
        return f"{city}: 9-18"

    async def rollout(question: str) -> art.Trajectory:
        llm = art_langgraph.init_chat_model(model.name, temperature=0.0, max_tokens=40)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # create_react_agent's move to langchain.agents
            agent = create_react_agent(llm.bind_tools([lookup], tool_choice="required"), [lookup])
        await agent.ainvoke({"messages": [("user", question)]}, {"recursion_limit": 4})
        return art.Trajectory(messages_and_choices=[], reward=1.0)

    trajectory = await art_langgraph.wrap_rollout(model, rollout)("hours in Paris? marker-r")
    roles = [m["role"] for m in trajectory.messages()]
    assert roles[:3] == ["user", "assistant", "tool"] and trajectory.reward == 1.0
    assert trajectory.tools is not None and trajectory.tools[0]["function"]["name"] == "lookup"


async def test_the_inference_name_and_model_provider_are_accepted(model: art.TrainableModel):
    async with art_langgraph.rollout(model) as r:
        llm = art_langgraph.init_chat_model(
            model.get_inference_name(), model_provider="openai", **FAST
        )
        await llm.ainvoke("named marker-i")
    assert r.trajectory.messages()[0]["content"] == "named marker-i"
    assert llm.art_model is model


async def test_a_name_of_another_model_inside_a_rollout_is_a_clear_error(
    model: art.TrainableModel,
):
    async with art_langgraph.rollout(model):
        with pytest.raises(art_langgraph.ModelNameMismatchError, match=model.name):
            art_langgraph.init_chat_model("gpt-4o", temperature=1.0)
        with pytest.raises(art.UnsupportedOptionError, match="configurable_fields"):
            art_langgraph.init_chat_model(configurable_fields="any")  # type: ignore[arg-type]
        with pytest.raises(art.UnsupportedOptionError, match="OpenAI-compatible"):
            art_langgraph.init_chat_model(model.name, model_provider="anthropic")


def test_a_name_outside_any_rollout_needs_a_rollout():
    with pytest.raises(art_langgraph.NoRolloutError, match=r"init_chat_model\('agent'\)"):
        art_langgraph.init_chat_model("agent", temperature=1.0)


async def test_wrap_rollout_as_a_decorator_returning_the_reward(model: art.TrainableModel):
    @art_langgraph.wrap_rollout(model)
    async def agent(question: str) -> float:
        await art_langgraph.init_chat_model(model.name, **FAST).ainvoke(question)
        return 0.25

    trajectory = await agent("decorated marker-d")
    assert trajectory.reward == 0.25
    assert trajectory.messages()[0]["content"] == "decorated marker-d"


async def test_a_returned_trajectory_without_calls_keeps_its_own_conversation(
    model: art.TrainableModel,
):
    own = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "scripted"}]

    async def scripted() -> art.Trajectory:
        return art.Trajectory(messages_and_choices=list(own), reward=0.5)

    trajectory = await art_langgraph.wrap_rollout(model, scripted)()
    assert trajectory.messages() == own and trajectory.reward == 0.5


async def test_returning_anything_else_is_a_type_error_naming_the_choices(
    model: art.TrainableModel,
):
    async def wrong() -> str:
        return "done"

    with pytest.raises(TypeError, match=r"art\.Trajectory, the reward"):
        await art_langgraph.wrap_rollout(model, wrong)()
