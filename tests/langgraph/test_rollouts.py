"""LangGraph graphs on our backend: each call lands in its own rollout, with exact tokens.

Content markers identify the rollout a call belongs to: every prompt of rollout k contains
`marker-k`, so a call recorded in the wrong rollout fails the test.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import art_core as art
import art_langgraph

FAST = {"max_tokens": 3, "temperature": 1.0}


class State(TypedDict):
    marker: str
    notes: Annotated[list[str], operator.add]


def one_node_graph(name: str, node: Any, *, then: str = END) -> StateGraph:
    """START -> `name` -> `then` (END, or `name` itself for a loop that never ends)."""
    graph = StateGraph(State)
    graph.add_node(name, node)
    graph.add_edge(START, name)
    graph.add_edge(name, then)
    return graph


def planner_branches_subgraph(llm: BaseChatModel) -> Any:
    """planner -> (branch a, async | branch b, sync in a thread) -> subgraph: four calls."""

    async def sub_node(state: State) -> dict:
        await llm.ainvoke(f"sub {state['marker']}")
        return {"notes": ["sub"]}

    sub = one_node_graph("sub_node", sub_node)

    async def planner(state: State) -> dict:
        await llm.ainvoke(f"plan {state['marker']}")
        return {"notes": ["plan"]}

    async def branch_a(state: State) -> dict:
        await llm.ainvoke(f"a {state['marker']}")
        return {"notes": ["a"]}

    def branch_b(state: State) -> dict:
        llm.invoke(f"b {state['marker']}")
        return {"notes": ["b"]}

    graph = StateGraph(State)
    graph.add_node("planner", planner)
    graph.add_node("a", branch_a)
    graph.add_node("b", branch_b)
    graph.add_node("sub", sub.compile())
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "a")
    graph.add_edge("planner", "b")
    graph.add_edge(["a", "b"], "sub")
    graph.add_edge("sub", END)
    return graph.compile()


def prompts(trajectory: art.Trajectory) -> list[str]:
    return [h.messages()[0]["content"] for h in trajectory.histories()]


async def test_a_call_in_a_rollout_is_recorded_with_its_exact_tokens(model: art.TrainableModel):
    async with art_langgraph.rollout(model, scenario="greet") as r:
        llm = art_langgraph.init_chat_model(**FAST)
        reply = await llm.ainvoke("hello marker-0")
        r.reward = 1.0
    trajectory = r.trajectory
    assert trajectory.reward == 1.0 and trajectory.metadata["scenario"] == "greet"
    messages = trajectory.messages()
    assert messages[0]["content"] == "hello marker-0"
    assert messages[-1]["content"] == reply.content
    choice = trajectory.messages_and_choices[-1]
    assert choice.model_extra["completion_id"]  # trained on the server's recorded tokens
    assert isinstance(llm, BaseChatModel)


async def test_eight_concurrent_graph_runs_each_record_only_their_own_calls(
    model: art.TrainableModel,
):
    async def one(k: int) -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            graph = planner_branches_subgraph(art_langgraph.init_chat_model(**FAST))
            await graph.ainvoke({"marker": f"marker-{k}", "notes": []})
        return r.trajectory

    trajectories = await asyncio.gather(*(one(k) for k in range(8)))
    for k, trajectory in enumerate(trajectories):
        texts = prompts(trajectory)
        assert sorted(text.split()[0] for text in texts) == ["a", "b", "plan", "sub"]
        assert all(text.endswith(f"marker-{k}") for text in texts), texts


async def test_a_stock_chat_openai_is_captured_by_url_alone(model: art.TrainableModel):
    async with model.rollout() as r:
        llm = ChatOpenAI(base_url=r.base_url, api_key=r.api_key, model=r.model, **FAST)
        await planner_branches_subgraph(llm).ainvoke({"marker": "marker-z", "notes": []})
    assert sorted(prompts(r.trajectory)) == [
        "a marker-z",
        "b marker-z",
        "plan marker-z",
        "sub marker-z",
    ]


async def test_graph_trajectories_train_and_the_model_follows_the_new_step(
    model: art.TrainableModel,
):
    llm = art_langgraph.TrainableChatModel(model, **FAST)
    graph = planner_branches_subgraph(llm)

    async def run(k: int, reward: float) -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            await graph.ainvoke({"marker": f"marker-{k}", "notes": []})
            r.reward = reward
        return r.trajectory

    groups = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup([run(0, 0.0), run(1, 1.0)]),
            art.TrajectoryGroup([run(2, 1.0), run(3, 0.0)]),
        ],
        show_progress=False,
    )
    result = await model.train(groups, learning_rate=1e-3)
    assert result.step == 1 and result.metrics["trained_tokens"] > 0
    assert result.metrics["dropped/unknown_completion"] == 0
    async with art_langgraph.rollout(model) as r:
        await llm.ainvoke("after marker-9")
    records = await model.backend.rollout_records(r.id)
    assert records[0]["request"]["model"] == f"{model.name}@1"


async def test_wrap_rollout_returns_the_trajectory_with_the_reward(model: art.TrainableModel):
    async def agent(question: str) -> float:
        await art_langgraph.init_chat_model(**FAST).ainvoke(question)
        return 0.5

    trajectory = await art_langgraph.wrap_rollout(model, agent)("wrapped marker-w")
    assert trajectory.reward == 0.5 and prompts(trajectory) == ["wrapped marker-w"]


def test_a_model_is_needed_outside_a_rollout():
    with pytest.raises(art_langgraph.NoRolloutError, match="inside"):
        art_langgraph.init_chat_model()


async def test_the_prebuilt_react_agent_trains_unchanged_as_one_conversation(
    model: art.TrainableModel,
):
    """Forced tool calls (grammar-enforced, so even the tiny model's arguments fit the schema)
    make the prebuilt agent call its tool until its step budget runs out; it then stops on its
    own with a final message (LangGraph's rule for the prebuilt agent), so the rollout is a
    trajectory: each call extends the previous one, so it is one conversation with the tool
    results in it."""
    import warnings

    from langchain_core.tools import tool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's move to langchain.agents
        from langgraph.prebuilt import create_react_agent

    @tool
    def lookup(city: str) -> str:
        """The opening hours of our shop in a city."""
        return f"{city}: 9-18"

    llm = art_langgraph.TrainableChatModel(model, max_tokens=40, temperature=0.0)
    agent = create_react_agent(llm.bind_tools([lookup], tool_choice="required"), [lookup])
    async with art_langgraph.rollout(model) as r:
        await agent.ainvoke(
            {"messages": [("user", "hours in Paris? marker-t")]}, {"recursion_limit": 4}
        )
    trajectory = r.trajectory
    assert trajectory.additional_histories == []
    roles = [m["role"] for m in trajectory.messages()]
    assert roles[:3] == ["user", "assistant", "tool"] and roles.count("assistant") >= 2
    assert trajectory.tools[0]["function"]["name"] == "lookup"
    assert all(
        item.model_extra["completion_id"]
        for item in trajectory.messages_and_choices
        if not isinstance(item, dict)
    )


async def test_a_graph_that_hits_the_recursion_limit_is_an_exception_kept_on_its_group(
    model: art.TrainableModel,
):
    from langgraph.errors import GraphRecursionError

    llm = art_langgraph.TrainableChatModel(model, **FAST)

    async def think(state: State) -> dict:
        await llm.ainvoke(f"think {state['marker']}")
        return {"notes": ["again"]}

    graph = one_node_graph("think", think, then="think").compile()

    async def run() -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            await graph.ainvoke({"marker": "marker-r", "notes": []}, {"recursion_limit": 3})
        return r.trajectory

    [group] = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([run(), run()])], max_exceptions=2, show_progress=False
    )
    assert group.trajectories == []
    assert [e.type for e in group.exceptions] == [GraphRecursionError.__name__] * 2


def forced_tool_graph(llm: art_langgraph.TrainableChatModel, handle_tool_errors: bool) -> Any:
    """agent (forced to call `broken`) -> ToolNode -> end; the tool always raises."""
    from langchain_core.tools import tool
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode

    @tool
    def broken(city: str) -> str:
        """Look up a city (always fails)."""
        raise ValueError(f"lookup service down for {city!r}")

    bound = llm.bind_tools([broken], tool_choice="required")

    async def agent(state: MessagesState) -> dict:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([broken], handle_tool_errors=handle_tool_errors))
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "tools")
    graph.add_edge("tools", END)
    return graph.compile()


async def test_a_handled_tool_error_is_an_observation_in_the_trajectory(
    model: art.TrainableModel,
):
    llm = art_langgraph.TrainableChatModel(model, max_tokens=40, temperature=0.0)
    async with art_langgraph.rollout(model) as r:
        state = await forced_tool_graph(llm, True).ainvoke({"messages": [("user", "marker-e")]})
    assert "lookup service down" in state["messages"][-1].content
    assert r.trajectory.messages()[-1]["tool_calls"][0]["function"]["name"] == "broken"


async def test_an_unhandled_tool_error_ends_the_rollout_as_a_kept_exception(
    model: art.TrainableModel,
):
    llm = art_langgraph.TrainableChatModel(model, max_tokens=40, temperature=0.0)
    graph = forced_tool_graph(llm, False)

    async def run() -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            await graph.ainvoke({"messages": [("user", "marker-u")]})
        return r.trajectory

    [group] = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([run()])], max_exceptions=1, show_progress=False
    )
    assert group.exceptions[0].type == "ValueError"
    assert "lookup service down" in group.exceptions[0].message


async def test_structured_output_and_a_checkpointer_inside_a_rollout(model: art.TrainableModel):
    from langgraph.checkpoint.memory import InMemorySaver
    from pydantic import BaseModel

    class Answer(BaseModel):
        city: str
        open: bool

    llm = art_langgraph.TrainableChatModel(model, max_tokens=60, temperature=0.0)
    structured = llm.with_structured_output(Answer, method="json_schema")

    async def answer(state: State) -> dict:
        result = await structured.ainvoke(f"is it open {state['marker']}")
        assert isinstance(result, Answer)
        return {"notes": [result.city]}

    app = one_node_graph("answer", answer).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t-1"}}
    async with art_langgraph.rollout(model) as r:
        await app.ainvoke({"marker": "marker-s", "notes": []}, config)
        await app.ainvoke({"marker": "marker-s2", "notes": []}, config)  # resumes the thread
    assert prompts(r.trajectory) == ["is it open marker-s", "is it open marker-s2"]
    snapshot = await app.aget_state(config)
    assert len(snapshot.values["notes"]) == 2  # the checkpointer kept both runs' notes


# ------------------------------------------------------------------ failed, cancelled, unplaced


def endless_graph(llm: BaseChatModel) -> Any:
    async def think(state: State) -> dict:
        await llm.ainvoke(f"think {state['marker']}")
        return {"notes": ["again"]}

    return one_node_graph("think", think, then="think").compile()


async def test_a_run_cancelled_from_inside_is_kept_with_its_calls_and_released(
    model: art.TrainableModel,
):
    """The rule for a cancelled run: the agent cancelled its own graph run, so the rollout is an
    exception kept on its group (the gather goes on); the calls it made are on the exception for
    review, never trained, and released on the server at once."""
    graph = endless_graph(art_langgraph.TrainableChatModel(model, **FAST))
    rollout_ids: list[str] = []

    async def cancelled_run() -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            rollout_ids.append(r.id)
            run = asyncio.create_task(
                graph.ainvoke({"marker": "marker-c", "notes": []}, {"recursion_limit": 1000})
            )
            while not (await model.backend.rollout_records(r.id)):
                await asyncio.sleep(0.05)
            run.cancel()
            await run
        return r.trajectory

    async def finished_run() -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            await art_langgraph.init_chat_model(**FAST).ainvoke("done marker-f")
        return r.trajectory

    [group] = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([cancelled_run(), finished_run()])],
        max_exceptions=1,
        show_progress=False,
    )
    assert len(group.trajectories) == 1 and prompts(group.trajectories[0]) == ["done marker-f"]
    [failure] = group.exceptions
    assert failure.type == "CancelledError"
    assert failure.partial_trajectory is not None
    assert set(prompts(failure.partial_trajectory)) == {"think marker-c"}
    assert "not trained" in failure.traceback
    assert await model.backend.rollout_records(rollout_ids[0]) == []


async def test_a_run_past_its_timeout_is_an_exception_with_its_calls(model: art.TrainableModel):
    graph = endless_graph(art_langgraph.TrainableChatModel(model, **FAST))

    async def run() -> art.Trajectory:
        async with art_langgraph.rollout(model) as r, asyncio.timeout(None) as deadline:
            run = asyncio.ensure_future(
                graph.ainvoke({"marker": "marker-o", "notes": []}, {"recursion_limit": 1000})
            )
            while not (await model.backend.rollout_records(r.id)):
                await asyncio.sleep(0.05)
            deadline.reschedule(asyncio.get_running_loop().time())  # time is up, now
            await run
        return r.trajectory

    [group] = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([run()])], max_exceptions=1, show_progress=False
    )
    [failure] = group.exceptions
    assert failure.type == "TimeoutError"
    assert failure.partial_trajectory and prompts(failure.partial_trajectory)


async def test_cancelling_the_gather_stops_every_rollout(model: art.TrainableModel):
    graph = endless_graph(art_langgraph.TrainableChatModel(model, **FAST))

    async def run() -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            await graph.ainvoke({"marker": "marker-g", "notes": []}, {"recursion_limit": 1000})
        return r.trajectory

    gather = asyncio.create_task(
        art.gather_trajectory_groups([art.TrajectoryGroup([run(), run()])], show_progress=False)
    )
    await asyncio.sleep(0.5)
    gather.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gather
    assert model.open_rollouts == 0


async def test_a_call_that_lost_its_rollout_is_counted_in_the_next_step(
    model: art.TrainableModel, caplog: pytest.LogCaptureFixture
):
    """A thread started by hand does not inherit the rollout's context: its call cannot be
    placed in any trajectory, so it is logged and counted, not lost silently."""
    import threading

    llm = art_langgraph.TrainableChatModel(model, **FAST)

    async def run(k: int, reward: float) -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            await llm.ainvoke(f"placed marker-{k}")
            if k == 0:
                thread = threading.Thread(target=llm.invoke, args=("lost marker-0",))
                thread.start()
                await asyncio.to_thread(thread.join)
            r.reward = reward
        return r.trajectory

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([run(0, 0.0), run(1, 1.0)])], show_progress=False
    )
    assert "calls_outside_rollout" in caplog.text
    assert all("lost" not in p for g in groups for t in g.trajectories for p in prompts(t))
    result = await model.train(groups, learning_rate=1e-3)
    assert result.metrics["dropped/calls_outside_rollout"] == 1
    assert not model.pending_metrics  # reported once


async def test_extra_choices_of_an_n_call_are_counted_as_unused(model: art.TrainableModel):
    llm = art_langgraph.TrainableChatModel(model, n=3, **FAST)

    async def run(reward: float) -> art.Trajectory:
        async with art_langgraph.rollout(model) as r:
            await llm.ainvoke("three choices marker-n")
            r.reward = reward
        return r.trajectory

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([run(0.0), run(1.0)])], show_progress=False
    )
    assert [t.metrics["dropped/unused_choices"] for t in groups[0].trajectories] == [2, 2]
    result = await model.train(groups, learning_rate=1e-3)
    assert result.metrics["dropped/unused_choices"] == 4
