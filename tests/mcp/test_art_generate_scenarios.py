"""ART's `art.mcp.generate_scenarios(tools=..., num_scenarios=..., generator_model=...)`: ART's
documented calls run with only the import changed, the generator being the scripted
OpenAI-compatible server on 127.0.0.1 (real HTTP); they return ART's GeneratedScenarioCollection.
Our `(server, n, generator)` form keeps returning a list (tests/mcp/test_train.py)."""

from __future__ import annotations

import json

import mcp.types
import pytest

import art_core as art
import art_mcp
from art_core.mcp import GeneratedScenarioCollection, generate_scenarios
from art_mcp._scenarios import tool_specs
from examples.mcp_servers.inventory_server import create_server
from tests.support.scripted_judge import ScriptedJudge, responder

INVENTORY_TOOLS = ("search_items", "update_stock", "low_stock_report")


async def test_arts_scenario_generation_block_runs_with_only_the_import_changed(
    scripted_judge: ScriptedJudge,
    capsys: pytest.CaptureFixture[str],
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
):
    """docs/features/mcp-rl.mdx, "Scenario Generation", with OpenRouter's URL and key ours."""
    # A cache of its own: the session's cache may hold this very request's answer already (the
    # docs test runs the same block), and then nothing would reach the scripted generator.
    monkeypatch.setenv("ART_CACHE_DIR", str(tmp_path))
    scripted_judge.default = responder
    tools_list = await art_mcp.McpServer.from_object(create_server()).list_tools()
    your_openrouter_key, openrouter_url = "test-key", scripted_judge.url

    scenario_collection = await generate_scenarios(
        tools=tools_list,
        num_scenarios=24,
        show_preview=True,
        generator_model="openai/gpt-4.1-mini",
        generator_api_key=your_openrouter_key,
        generator_base_url=openrouter_url,
    )

    assert isinstance(scenario_collection, GeneratedScenarioCollection)
    assert len(scenario_collection) == len(scenario_collection.scenarios) == 24
    assert all(isinstance(s, art.Scenario) and s.task for s in scenario_collection.scenarios)
    request = scripted_judge.requests[0]
    assert request["model"] == "openai/gpt-4.1-mini"  # sent to the given URL as written
    assert all(name in scripted_judge.user_prompt(0) for name in INVENTORY_TOOLS)
    shown = capsys.readouterr().out
    assert "Difficulty distribution:" in shown and "   2/5:  24" in shown
    assert f"   1. {scenario_collection[0].task}  (difficulty 2/5)" in shown
    assert "   6. " not in shown  # ART previews five


async def test_arts_training_pipeline_block_reads_the_key_from_the_environment(
    scripted_judge: ScriptedJudge,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    """The "Basic Training Pipeline" block: resources too, the generator from the environment."""
    monkeypatch.setenv("ART_CACHE_DIR", str(tmp_path))  # a cache of its own, as above
    scripted_judge.default = responder
    monkeypatch.setenv("OPENAI_BASE_URL", scripted_judge.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    server = art_mcp.McpServer.from_object(create_server())
    tools_list, resources_list = await server.list_tools(), await server.list_resources()

    scenario_collection = await generate_scenarios(
        tools=tools_list,
        resources=resources_list,
        num_scenarios=10,
        show_preview=False,
        generator_model="openai/gpt-4o-mini",
    )
    tasks = [scenario.task for scenario in scenario_collection.scenarios]

    assert len(set(tasks)) == 10
    assert scripted_judge.requests[0]["model"] == "gpt-4o-mini"  # the provider's own name
    assert "inventory://categories" in scripted_judge.user_prompt(0)
    assert capsys.readouterr().out == ""


def test_tools_are_taken_as_arts_callers_pass_them():
    sdk_tool = mcp.types.Tool(
        name="get_quote", description="A stock quote.", input_schema={"type": "object"}
    )
    listing = mcp.types.ListToolsResult(tools=[sdk_tool])
    art_shape = {"name": "get_rsi", "description": "RSI.", "parameters": {"type": "object"}}
    mcp_dict = {"name": "search", "inputSchema": {"type": "object", "properties": {"q": {}}}}
    openai_tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}

    specs = tool_specs([sdk_tool, art_shape, mcp_dict, openai_tool])

    assert [spec["function"]["name"] for spec in specs] == [
        "get_quote",
        "get_rsi",
        "search",
        "lookup",
    ]
    assert specs[0]["function"]["description"] == "A stock quote."
    assert specs[2]["function"]["parameters"]["properties"] == {"q": {}}
    assert tool_specs(listing) == specs[:1]  # ClientSession.list_tools()'s result
    with pytest.raises(art_mcp.McpConfigError, match=r"tools\[1\] has no name"):
        tool_specs([sdk_tool, {"description": "nameless"}])
    with pytest.raises(art_mcp.McpConfigError, match="list of MCP tools"):
        tool_specs({"name": "one tool, not a list"})


@pytest.mark.parametrize(
    ("call", "says"),
    [
        ({"tools": [], "resources": []}, "at least one tool or resource"),
        ({"tools": [{"name": "a"}], "n": 2, "num_scenarios": 2}, "n or num_scenarios"),
        (
            {"tools": [{"name": "a"}], "generator": "openai/x", "generator_model": "openai/y"},
            "not both",
        ),
    ],
)
async def test_contradictory_arguments_are_refused_before_any_request(call: dict, says: str):
    with pytest.raises(art_mcp.McpConfigError, match=says):
        await generate_scenarios(**call)


async def test_a_server_and_arts_tools_together_are_refused():
    server = art_mcp.McpServer.from_object(create_server())
    with pytest.raises(art_mcp.McpConfigError, match="either a server or ART's tools"):
        await generate_scenarios(server, 2, "openai/x", tools=[{"name": "a"}])


async def test_arts_keywords_work_in_our_server_form_too(
    scripted_judge: ScriptedJudge, capsys: pytest.CaptureFixture[str]
):
    scripted_judge.default = responder
    server = art_mcp.McpServer.from_object(create_server())
    scenarios = await art_mcp.generate_scenarios(
        server,
        num_scenarios=2,
        generator_model="scripted",
        generator_base_url=scripted_judge.url,
        show_preview=True,
        cache=False,
    )
    assert isinstance(scenarios, list) and len(scenarios) == 2
    assert "   2. " in capsys.readouterr().out


def test_the_collection_has_arts_helpers_and_is_a_sequence_of_scenarios():
    collection = GeneratedScenarioCollection.from_dicts(
        [{"task": f"Restock item number {k} today", "difficulty": k % 5 + 1} for k in range(10)]
    )
    train, val = collection.split(8)
    assert [len(train), len(val)] == [8, 2] and val[0].task == "Restock item number 8 today"
    with pytest.raises(ValueError, match="train_size"):
        collection.split(11)
    assert [s.difficulty for s in collection.filter_by_difficulty(4, 5)] == [4, 5, 4, 5]
    assert collection.get_difficulty_distribution()[1] == 2
    assert collection.get_summary()["total_scenarios"] == 10
    assert collection.shuffle(seed=1).scenarios == collection.shuffle(seed=1).scenarios
    assert sorted(s.task for s in collection.shuffle()) == sorted(s.task for s in collection)
    again = GeneratedScenarioCollection.from_json(collection.to_json())
    assert again.scenarios == collection.scenarios
    assert json.loads(collection.to_json())["scenarios"][0] == {
        "task": "Restock item number 0 today",
        "difficulty": 1,
    }
    ours_train, ours_val = art.split_scenarios(collection, val_fraction=0.2)
    assert len(ours_train) == 8 and len(ours_val) == 2
