"""art_mcp against real MCP servers: the example inventory server (in process, over HTTP, over
stdio), the published mcp-server-time (stdio), and a toy server for the edge cases. The policy is
scripted (an OpenAI-compatible server on 127.0.0.1) where a path must be exact, or the tiny model
on our backend for the plumbing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import art_core as art
import art_mcp
from examples.mcp_servers.inventory_server import create_server
from tests.mcp.toy_server import toy_server
from tests.support.scripted_judge import Reply, call
from tests.support.servers import free_port

TOY_SERVER_PATH = str(Path(__file__).with_name("toy_server.py"))
INVENTORY_TOOLS = {"search_items", "get_item", "create_item", "update_stock", "low_stock_report"}


def tool_texts(trajectory: art.Trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages() if m["role"] == "tool"]


def pool_tickets(server: art_mcp.McpServer) -> list[art_mcp.McpSession | None]:
    """What the pool holds now: idle sessions, and None for each free slot."""
    pool = server._pool
    assert pool is not None
    tickets = [pool.get_nowait() for _ in range(pool.qsize())]
    for ticket in reversed(tickets):  # back in their order (the pool is last in, first out)
        pool.put_nowait(ticket)
    return tickets


# ---------------------------------------------------------------------------------- discovery


@pytest.mark.parametrize("transport", ["object", "http", "stdio"])
async def test_discovery_is_the_same_over_every_transport(
    transport: str, inventory_http_url: str, inventory_stdio_command: tuple[str, list[str]]
):
    server = {
        "object": lambda: art_mcp.McpServer.from_object(create_server()),
        "http": lambda: art_mcp.McpServer.from_url(inventory_http_url),
        "stdio": lambda: art_mcp.McpServer.from_command(*inventory_stdio_command),
    }[transport]()
    tools = await server.list_tools()
    assert {t.name for t in tools} == INVENTORY_TOOLS
    search = next(t for t in tools if t.name == "search_items")
    assert search.description and "query" in search.input_schema["properties"]
    parameters = search.openai_tool()["function"]["parameters"]
    assert parameters["type"] == "object" and "$schema" not in parameters
    assert [r.uri for r in await server.list_resources()] == ["inventory://categories"]
    assert [p.name for p in await server.list_prompts()] == ["restocking_plan"]


async def test_colliding_names_are_made_valid_reported_and_reach_the_right_tool(
    policy, caplog: pytest.LogCaptureFixture
):
    scripted, model = policy
    server = art_mcp.McpServer.from_object(toy_server())
    tools = {t.name: t.openai_name for t in await server.list_tools()}
    assert tools["notes.search"] == "notes_search" and tools["notes/search"] == "notes_search_2"
    assert (await server.tool_names()).collisions == [("notes/search", "notes_search_2")]
    assert "offered to the model as 'notes_search_2'" in caplog.text
    scripted.queue(
        call("notes_search_2", {"query": "q"}),
        call("notes_search", {"query": "q"}),
        call("complete_task", {"summary": "found"}),
    )
    trajectory = await art_mcp.rollout(model, server, "search both")
    assert tool_texts(trajectory)[:2] == ["slash:q", "dot:q"]
    sent = {t["function"]["name"] for t in scripted.requests[0]["tools"]}
    assert {"notes_search", "notes_search_2", "complete_task"} <= sent


# ------------------------------------------------------------------------ scripted tool paths


async def test_a_tool_call_and_complete_task(policy):
    scripted, model = policy
    scripted.queue(
        call("search_items", {"query": "tea"}),
        call("complete_task", {"summary": "listed the teas"}),
    )
    server = art_mcp.McpServer.from_object(create_server())
    trajectory = await art_mcp.rollout(model, server, "Which teas do we sell?")
    [result] = tool_texts(trajectory)
    assert "tea" in result.lower() and not result.startswith("Tool error")
    m = trajectory.metrics
    assert (m["tool_calls"], m["tool_errors"], m["num_turns"]) == (1, 0, 2)
    assert m["task_completed"] is True and m["ran_out_of_turns"] is False
    assert trajectory.metadata["summary"] == "listed the teas"
    assert trajectory.metadata["scenario"] == "Which teas do we sell?"
    # The model saw the tool result in its next turn.
    assert scripted.requests[1]["messages"][-1]["role"] == "tool"


async def test_a_tool_error_is_an_observation_the_agent_sees(policy):
    scripted, model = policy
    scripted.queue(call("update_stock", {"sku": "COF-003", "delta": -1000}), Reply("I could not."))
    trajectory = await art_mcp.rollout(
        model, art_mcp.McpServer.from_object(create_server()), "Sell 1000 bags"
    )
    [result] = tool_texts(trajectory)
    assert result.startswith("Tool error:") and "below zero" in result
    assert trajectory.metrics["tool_errors"] == 1 and trajectory.metrics["task_completed"] is False
    assert "below zero" in trajectory.logs[0]


async def test_bad_arguments_and_unknown_tools_are_observations(policy):
    scripted, model = policy
    scripted.queue(call("search_items", "{not json"), call("no_such_tool"), Reply("done"))
    trajectory = await art_mcp.rollout(
        model, art_mcp.McpServer.from_object(create_server()), "anything"
    )
    texts = tool_texts(trajectory)
    assert "not valid JSON" in texts[0] and "no tool named 'no_such_tool'" in texts[1]
    assert trajectory.metrics["tool_errors"] == 2


async def test_a_hanging_tool_hits_its_timeout_and_the_rollout_goes_on(policy):
    scripted, model = policy
    scripted.queue(call("hang"), call("complete_task", {"summary": "gave up"}))
    server = art_mcp.McpServer.from_object(toy_server(), call_timeout=0.5)
    trajectory = await art_mcp.rollout(model, server, "wait")
    assert "did not answer within 0.5 s" in tool_texts(trajectory)[0]
    assert trajectory.metrics["tool_timeouts"] == 1 and trajectory.metrics["task_completed"]


async def test_a_huge_result_is_shortened_with_a_visible_marker(policy):
    scripted, model = policy
    scripted.queue(call("huge", {"size": 50_000}), Reply("ok"))
    server = art_mcp.McpServer.from_object(toy_server(), max_result_chars=1000)
    trajectory = await art_mcp.rollout(model, server, "big")
    [text] = tool_texts(trajectory)
    assert "[... 49000 characters cut ...]" in text and len(text) < 1100
    assert trajectory.metrics["truncated_results"] == 1


async def test_images_become_placeholders_in_the_tool_message(policy):
    scripted, model = policy
    scripted.queue(call("picture"), Reply("ok"))
    trajectory = await art_mcp.rollout(model, art_mcp.McpServer.from_object(toy_server()), "img")
    assert tool_texts(trajectory) == ["[image: image/png, 100 bytes]\n\na tiny picture"]


async def test_running_out_of_turns_is_a_metric(policy):
    scripted, model = policy
    scripted.default = call("search_items", {"query": "tea"})
    trajectory = await art_mcp.rollout(
        model, art_mcp.McpServer.from_object(create_server()), "loop", max_turns=3
    )
    assert trajectory.metrics["ran_out_of_turns"] is True and trajectory.metrics["num_turns"] == 3


async def test_a_server_killed_mid_rollout_is_an_exception_kept_on_its_group(policy):
    scripted, model = policy
    server = art_mcp.McpServer.from_command(sys.executable, [TOY_SERVER_PATH])

    def script(body: dict) -> Reply:
        last = body["messages"][-1]["content"]
        return call("crash") if "crash" in last else call("complete_task", {"summary": "ok"})

    scripted.default = script
    [group] = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup(
                [
                    art_mcp.rollout(model, server, "crash it"),
                    art_mcp.rollout(model, server, "just finish"),
                ]
            )
        ],
        max_exceptions=1,
        show_progress=False,
    )
    assert len(group.trajectories) == 1 and group.trajectories[0].metrics["task_completed"]
    [failure] = group.exceptions
    assert failure.type == "McpServerError" and "Connection closed" in failure.message


async def test_an_unreachable_url_fails_with_a_clear_message(policy):
    _, model = policy
    server = art_mcp.McpServer.from_url(f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=10)
    with pytest.raises(art_mcp.McpServerError, match="Check the server is running"):
        await art_mcp.rollout(model, server, "anything")


async def test_allowed_tools_limit_what_the_agent_sees_and_must_exist():
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=["get_item"])
    assert [t.name for t in await server.list_tools()] == ["get_item"]
    wrong = art_mcp.McpServer.from_object(create_server(), allowed_tools=["get_itme"])
    with pytest.raises(ValueError, match="get_itme"):
        await wrong.list_tools()


def test_bad_construction_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="http"):
        art_mcp.McpServer.from_url("127.0.0.1:8000/mcp")
    with pytest.raises(ValueError, match="pool_size"):
        art_mcp.McpServer.from_object(create_server(), pool_size=-1)


async def test_a_pool_lends_sessions_and_replaces_a_broken_one(policy):
    scripted, model = policy
    server = art_mcp.McpServer.from_command(sys.executable, [TOY_SERVER_PATH], pool_size=2)
    scripted.default = lambda body: (
        call("notes_search", {"query": "q"})
        if body["messages"][-1]["role"] == "user"
        else call("complete_task", {"summary": "ok"})
    )
    async with server:
        first = await art.gather_trajectories(
            [art_mcp.rollout(model, server, f"task {k}") for k in range(6)], show_progress=False
        )
        assert len(first) == 6 and len(pool_tickets(server)) == 2  # all given back
        async with server.session() as session:
            tools = {t.openai_name: t for t in await server.list_tools()}
            with pytest.raises(art_mcp.McpServerError):
                await session.call_tool(tools["crash"], {})
        tickets = pool_tickets(server)
        assert session not in tickets and len(tickets) == 2  # its slot is free for a new one
        again = await art_mcp.rollout(model, server, "after the crash")
        assert tool_texts(again)[0] == "dot:q"


# ---------------------------------------------------------------- a published server: mcp-server-time


async def test_mcp_server_time_discovery_rollout_and_a_training_step(
    time_server_command: tuple[str, list[str]], policy, tiny_model: art.TrainableModel
):
    server = art_mcp.McpServer.from_command(*time_server_command)
    names = {t.name for t in await server.list_tools()}
    assert {"get_current_time", "convert_time"} <= names
    scripted, prompted = policy
    scripted.queue(
        call("get_current_time", {"timezone": "Europe/Paris"}),
        call("complete_task", {"summary": "told the time"}),
    )
    trajectory = await art_mcp.rollout(prompted, server, "What time is it in Paris?")
    payload = json.loads(tool_texts(trajectory)[0])
    assert payload["timezone"] == "Europe/Paris" and "datetime" in payload

    # The tiny model on our backend: whatever it writes, the rollouts train.
    groups = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup(
                art_mcp.rollout(tiny_model, server, "time in Tokyo?", max_turns=2, max_tokens=24)
                for _ in range(2)
            )
        ],
        show_progress=False,
    )
    for reward, trajectory in zip([0.0, 1.0], groups[0].trajectories, strict=True):
        trajectory.reward = reward
    result = await tiny_model.train(groups, learning_rate=1e-3)
    assert result.step == 1 and result.metrics["trained_tokens"] > 0
    assert result.metrics["dropped/unknown_completion"] == 0


@pytest.mark.parametrize("transport", ["object", "http"])
async def test_the_tiny_model_runs_the_agent_loop_on_our_backend(
    transport: str, inventory_http_url: str, tiny_model: art.TrainableModel
):
    only = {"allowed_tools": ["low_stock_report"]}  # the tiny model's context is 2048 tokens
    server = (
        art_mcp.McpServer.from_object(create_server(), **only)
        if transport == "object"
        else art_mcp.McpServer.from_url(inventory_http_url, **only)
    )
    trajectory = await art_mcp.rollout(tiny_model, server, "low stock?", max_turns=2, max_tokens=24)
    assert trajectory.metrics["num_turns"] >= 1
    choices = [i for i in trajectory.messages_and_choices if not isinstance(i, dict)]
    assert choices and all(c.model_extra["completion_id"] for c in choices)


# `make test` builds it and names it (`make lock` builds its own beside a fresh venv).
MCP1_PYTHON = Path(
    os.environ.get("ART_MCP1_PYTHON")
    or Path(__file__).resolve().parents[2] / ".venv" / "mcp1" / "bin" / "python"
)


async def test_a_server_built_on_mcp_1x_works_over_stdio(policy):
    if not MCP1_PYTHON.exists():
        pytest.skip("`make test` builds .venv/mcp1 (an interpreter with mcp<2) for this test")
    scripted, model = policy
    server = art_mcp.McpServer.from_command(
        str(MCP1_PYTHON), [str(Path(__file__).with_name("v1_server.py"))]
    )
    assert {t.name for t in await server.list_tools()} == {"read_note", "list_notes"}
    scripted.queue(
        call("read_note", {"title": "groceries"}),
        call("read_note", {"title": "nope"}),
        call("complete_task", {"summary": "read"}),
    )
    trajectory = await art_mcp.rollout(model, server, "What is on the grocery list?")
    texts = tool_texts(trajectory)
    assert texts[0] == "milk, eggs, coffee"
    assert texts[1].startswith("Tool error:") and "no note titled 'nope'" in texts[1]


def test_a_pooled_server_serves_a_second_event_loop():
    """Sessions belong to the loop that opened them: a new loop gets new sessions."""
    import asyncio

    server = art_mcp.McpServer.from_command(sys.executable, [TOY_SERVER_PATH], pool_size=2)

    async def search() -> str:
        tools = {t.openai_name: t for t in await server.list_tools()}
        async with server.session() as session:
            return (await session.call_tool(tools["notes_search"], {"query": "q"})).text

    assert asyncio.run(search()) == "dot:q"
    assert asyncio.run(search()) == "dot:q"
