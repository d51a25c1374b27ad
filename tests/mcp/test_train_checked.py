"""art_mcp.train with checkable scenarios: the scenario file, the code reward, the SFT warm start
and `art mcp-train --scenarios FILE --sft FILE`, against the real inventory server (stdio and
HTTP) with the scripted policy or the tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import art_core as art
import art_mcp
from art_core.rewards import RunSettings
from art_core.utils.sft import InvalidSFTFileError
from art_mcp import cli
from art_mcp._checked import (
    CheckedScenario,
    check_offered_tools,
    code_reward,
    load_scenarios,
    parse_scenario,
)
from art_mcp._errors import McpConfigError, McpScenarioFileError, McpScenarioToolsError
from art_mcp._train import demonstrations
from examples.mcp_servers.inventory_server import create_server
from tests.mcp.conftest import INVENTORY_SERVER_PATH
from tests.mcp.toy_server import toy_server
from tests.support.scripted_judge import Reply, ScriptedJudge, call, responder

EXAMPLES = INVENTORY_SERVER_PATH.parent
SCENARIOS = EXAMPLES / "inventory_scenarios.jsonl"
DEMOS = EXAMPLES / "inventory_demos.jsonl"
TOOLS = ["search_items", "get_item"]


def subset(source: Path, folder: Path, lines: int) -> Path:
    """The first `lines` lines of a committed file, as a new file (a short run)."""
    target = folder / source.name
    target.write_text("".join(source.read_text().splitlines(keepends=True)[:lines]))
    return target


# ------------------------------------------------------------------------------- the file


def test_the_inventory_scenario_file_parses_with_answers_and_calls():
    scenarios = load_scenarios(SCENARIOS)
    assert len(scenarios) == 90 and all(s.checkable for s in scenarios)
    first = scenarios[0]
    assert first.task == "How many units of COF-001 are in stock?"
    assert first.answer == [24] and first.expected == "24"
    assert first.tool_calls == [{"name": "get_item", "arguments": {"sku": "COF-001"}}]
    # A bare tool name is a call with any arguments.
    assert scenarios[2].tool_calls == [{"name": "search_items", "arguments": {}}]


@pytest.mark.parametrize(
    ("line", "field", "says"),
    [
        ("{not json", None, "not JSON"),
        ('["task"]', None, "expected an object"),
        ('{"task": "t", "answer": 1, "expected": 1}', "expected", "known keys: task, answer"),
        ('{"answer": 1}', "task", "required"),
        ('{"task": "t", "answer": {"x": 1}}', "answer", "a string, a number or a list"),
        ('{"task": "t", "answer": [1, true]}', "answer", "got true"),
        ('{"task": "t", "tool_calls": "get_item"}', "tool_calls", "must be a list"),
        ('{"task": "t", "tool_calls": [{"tool": "x"}]}', "tool_calls", "[0] must be a tool name"),
        ('{"task": "t"}', None, "nothing to check"),
        ('{"task": "t", "answer": 1, "difficulty": 11}', "difficulty", "from 1 to 10"),
    ],
)
def test_a_bad_line_names_its_file_line_and_field(tmp_path: Path, line: str, field, says: str):
    path = tmp_path / "scenarios.jsonl"
    path.write_text('{"task": "fine", "answer": 1}\n\n' + line + "\n")
    with pytest.raises(McpScenarioFileError) as caught:
        load_scenarios(path)
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), 3, field)
    assert f"{path}, line 3" in str(error) and says in str(error)
    if field:
        assert f"field {field!r}" in str(error)
    assert isinstance(error, ValueError) and isinstance(error, art.ArtError)


def test_a_missing_or_empty_file_is_named(tmp_path: Path):
    with pytest.raises(McpScenarioFileError, match="No scenario file at"):
        load_scenarios(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(McpScenarioFileError, match="has no scenarios"):
        load_scenarios(tmp_path / "empty.jsonl")


# ------------------------------------------------------------- tools the scenarios call


def scenario_file(folder: Path, *lines: dict) -> Path:
    path = folder / "scenarios.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


STOCK = {"task": "How many units of COF-003?", "answer": 3, "tool_calls": ["get_item"]}
CREATE = {"task": "Add the tea TEA-100.", "answer": "TEA-100", "tool_calls": ["create_item"]}
RESTOCK = {"task": "Restock COF-001 to 50.", "tool_calls": ["get_item", "update_stock"]}
RESTOCK_TOO = {"task": "Restock TEA-002 to 9.", "tool_calls": ["update_stock", "complete_task"]}


async def test_scenarios_calling_a_tool_that_is_not_offered_fail_before_the_model_is_asked(
    policy, tmp_path: Path
):
    """`allowed_tools` leaves out create_item and update_stock: the checks of three scenarios
    could never pass. train() says which, before any request to the model."""
    scripted, model = policy
    path = scenario_file(tmp_path, STOCK, CREATE, RESTOCK, RESTOCK_TOO)
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=TOOLS)
    with pytest.raises(McpConfigError) as caught:
        await art_mcp.train(server, model, scenarios=path, max_tokens=8)  # type: ignore[arg-type]
    error = caught.value
    assert isinstance(error, McpScenarioToolsError)
    assert error.missing == {"create_item": [2], "update_stock": [3, 4]}
    message = str(error)
    assert message.startswith("3 scenario(s) require calls to tools the agent is not offered")
    assert "'update_stock' by scenario 3 ('Restock COF-001 to 50.'), 4 (" in message
    assert "Offered: search_items, get_item (and complete_task)" in message
    assert "--tools search_items,get_item,create_item,update_stock" in message
    assert scripted.requests == []  # the model was not asked anything


def test_scenarios_calling_offered_tools_and_complete_task_pass():
    tools = [
        art_mcp.McpTool(name=name, openai_name=name, description="", input_schema={})
        for name in ("get_item", "update_stock")
    ]
    scenarios = [parse_scenario(json.dumps(line)) for line in (STOCK, RESTOCK, RESTOCK_TOO)]
    check_offered_tools(scenarios, tools)
    check_offered_tools([art.Scenario(task="generated", difficulty=1)], [])  # nothing to check


async def test_a_scenario_naming_a_tool_the_server_lacks_or_by_its_mcp_name_is_told_so():
    server = art_mcp.McpServer.from_object(toy_server())
    lines = [
        {
            "task": "Find the notes on tea.",
            "tool_calls": ["notes.search"],
        },  # the model: notes_search
        {"task": "Delete the notes.", "tool_calls": ["delete_notes"]},
    ]
    scenarios = [parse_scenario(json.dumps(line)) for line in lines]
    with pytest.raises(McpScenarioToolsError) as caught:
        check_offered_tools(scenarios, await server.list_tools(), all_of_server=True)
    message = str(caught.value)
    assert "'notes.search' is offered to the model as 'notes_search': write that name" in message
    assert "The server has no tool named 'delete_notes'" in message and "--tools" not in message


def test_the_command_line_names_scenarios_calling_tools_left_out_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path = scenario_file(tmp_path, STOCK, CREATE)
    argv = ["--stdio", f"{sys.executable} {INVENTORY_SERVER_PATH}", "--tools", ",".join(TOOLS)]
    argv += ["--scenarios", str(path), "--path", str(tmp_path / "art")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "art mcp-train: error: 1 scenario(s) require calls to tools the agent is not" in err
    assert "'create_item' by scenario 2" in err and "Traceback" not in err
    assert not (tmp_path / "art").exists()  # no backend started


# ----------------------------------------------------------------------------- code reward


async def test_the_code_reward_checks_answer_and_calls_on_real_stdio_runs(
    policy, inventory_stdio_command
):
    scripted, model = policy
    command, arguments = inventory_stdio_command
    server = art_mcp.McpServer.from_command(command, arguments, allowed_tools=TOOLS)
    scenario = parse_scenario(
        json.dumps(
            {
                "task": "How many units of COF-003 are in stock?",
                "answer": 3,
                "tool_calls": [{"name": "get_item", "arguments": {"sku": "cof-003"}}],
            }
        )
    )
    runs = {
        "right": [
            call("get_item", {"sku": "COF-003"}),
            call("complete_task", {"summary": "3 left"}),
        ],
        # "COF-003" holds no 3 of its own: only the wrong number is in the answer.
        "wrong number": [
            call("get_item", {"sku": "COF-003"}),
            call("complete_task", {"summary": "COF-003 has 30 units"}),
        ],
        "no tool, right number in text": [Reply("There are 3 units.")],
        "wrong sku": [call("get_item", {"sku": "COF-004"}), Reply("COF-004: 7")],
    }
    rewards = {}
    async with server:
        for name, turns in runs.items():
            scripted.queue(*turns)
            trajectory = await art_mcp.rollout(model, server, scenario, max_turns=3)
            rewards[name] = await code_reward(scenario, trajectory, None)
            assert trajectory.reward == rewards[name]
    assert rewards == {
        "right": 1.0,
        "wrong number": 0.5,
        "no tool, right number in text": 0.5,
        "wrong sku": 0.0,
    }
    # The tool result the last run read was the real server's (COF-004 has 7).
    assert '"quantity": 7' in str(trajectory.messages()[3]["content"])


async def test_a_check_function_replaces_the_checks_and_must_return_0_to_1():
    scenario = art.Scenario(task="anything", difficulty=1)
    trajectory = art.Trajectory(messages_and_choices=[{"role": "assistant", "content": "done: 42"}])

    def sync_check(s: art.Scenario, t: art.Trajectory) -> float:
        return 0.25 if "42" in str(t.messages()[-1]["content"]) else 0.0

    async def async_check(s: art.Scenario, t: art.Trajectory) -> float:
        return 1.0

    assert await code_reward(scenario, trajectory, sync_check) == 0.25
    assert await code_reward(scenario, trajectory, async_check) == 1.0 == trajectory.reward
    with pytest.raises(McpConfigError, match="must return a number from 0 to 1"):
        await code_reward(scenario, trajectory, lambda s, t: 1.5)
    with pytest.raises(McpConfigError, match="nothing to check"):
        await code_reward(scenario, trajectory, None)


# -------------------------------------------------------------------------- demonstrations


async def test_demonstrations_get_the_agents_system_prompt_and_tools(tmp_path: Path):
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=TOOLS)
    demos = await demonstrations(server, DEMOS)
    assert len(demos) == 36
    first = demos[0].messages()
    assert first[0]["role"] == "system" and first[1]["role"] == "user"
    assert first[0]["content"].startswith("You are an agent that completes the user's task")
    names = [tool["function"]["name"] for tool in demos[0].tools or []]
    assert names == [*TOOLS, "complete_task"]
    bad = tmp_path / "demos.jsonl"
    bad.write_text(DEMOS.read_text().splitlines()[0] + '\n{"messages": []}\n')
    with pytest.raises(InvalidSFTFileError, match="line 2"):
        await demonstrations(server, bad)


# ------------------------------------------------------------------------------- training


async def test_train_with_code_reward_and_a_warm_start_over_http(
    tiny_model: art.TrainableModel, inventory_http_url: str, tmp_path: Path
):
    server = art_mcp.McpServer.from_url(inventory_http_url, allowed_tools=TOOLS)
    result = await art_mcp.train(
        server,
        tiny_model,
        scenarios=subset(SCENARIOS, tmp_path, 8),
        sft=subset(DEMOS, tmp_path, 4),
        sft_epochs=1,
        steps=1,
        groups_per_step=2,
        rollouts_per_group=2,
        max_turns=2,
        max_tokens=12,
        report_dir=tmp_path / "report",
        show_progress=False,
    )
    assert result.settings["reward"] == "code" and result.settings["sft_demonstrations"] == 4
    assert 0 <= result.settings["held_out_after_sft"] <= 1
    assert len(result.val_scenarios) == 2 and len(result.train_scenarios) == 6
    [step] = result.steps
    # The SFT step is step 1; the RL step trains on top of it (or, all tied, stays there).
    assert step.step == 1 + (step.metrics["groups/trainable"] > 0)
    assert step.metrics["groups/submitted"] == 2
    assert step.metrics["mcp/rollouts"] >= 4
    assert set(result.before.metrics) >= {"reward", "answer_correct", "tools_correct"}
    assert result.report is not None and "code checks" in result.report.read_text()
    assert result.judge_usage.requests == 0


async def test_max_minutes_starts_no_step_that_would_end_too_late(
    tiny_model: art.TrainableModel, tmp_path: Path
):
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=TOOLS)
    result = await art_mcp.train(
        server,
        tiny_model,
        scenarios=subset(SCENARIOS, tmp_path, 8),
        steps=5,
        groups_per_step=1,
        rollouts_per_group=2,
        max_turns=1,
        max_tokens=8,
        max_minutes=1e-6,  # past already: the first step runs, no other starts
        show_progress=False,
    )
    assert len(result.steps) == 1
    assert result.settings["steps"] == 5 and "held_out_after_sft" not in result.settings


async def test_the_run_settings_may_come_as_one_object(
    tiny_model: art.TrainableModel, judge_model: art.Model, tmp_path: Path
):
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=TOOLS)
    settings = RunSettings(
        steps=5, groups_per_step=1, rollouts_per_group=2, max_minutes=1e-6, show_progress=False
    )
    with pytest.raises(ValueError, match=r"not both \(got settings= and steps\)"):
        await art_mcp.train(server, tiny_model, scenarios=SCENARIOS, steps=2, settings=settings)
    with pytest.raises(McpConfigError, match="max_minutes works with reward 'code'"):
        await art_mcp.train(
            server, tiny_model, judge=judge_model, reward="ruler", settings=settings, max_tokens=8
        )
    result = await art_mcp.train(
        server, tiny_model, scenarios=subset(SCENARIOS, tmp_path, 8), max_turns=1, max_tokens=8,
        settings=settings,
    )  # fmt: skip
    assert len(result.steps) == 1 and result.settings["steps"] == 5


async def test_reward_both_averages_the_code_check_and_the_judge(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    tiny_model: art.TrainableModel,
    inventory_stdio_command,
    tmp_path: Path,
):
    scripted_judge.default = responder
    command, arguments = inventory_stdio_command
    server = art_mcp.McpServer.from_command(command, arguments, allowed_tools=TOOLS, pool_size=2)
    async with server:
        result = await art_mcp.train(
            server,
            tiny_model,
            judge=judge_model,
            reward="both",
            judge_options={"cache": False},
            scenarios=list(load_scenarios(subset(SCENARIOS, tmp_path, 8))),
            steps=1,
            groups_per_step=1,
            rollouts_per_group=2,
            max_turns=1,
            max_tokens=8,
            show_progress=False,
        )
    assert result.settings["reward"] == "both"
    judged = [r for r in scripted_judge.requests if "run_1" in str(r["response_format"])]
    assert judged and "get_item" in judged[0]["messages"][-1]["content"]
    assert result.judge_usage.requests == len(judged)


async def test_reward_options_are_checked(
    tiny_model: art.TrainableModel, judge_model: art.Model, tmp_path: Path
):
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=TOOLS)
    generated = [art.Scenario(task=f"task {k}", difficulty=1) for k in range(4)]
    with pytest.raises(McpConfigError, match="needs scenarios with checks"):
        await art_mcp.train(server, tiny_model, scenarios=generated, reward="code", max_tokens=8)
    with pytest.raises(McpConfigError, match="needs a judge"):
        await art_mcp.train(server, tiny_model, scenarios=generated, max_tokens=8)
    with pytest.raises(McpConfigError, match="use one of code, ruler, both"):
        await art_mcp.train(server, tiny_model, scenarios=SCENARIOS, reward="rulr", max_tokens=8)  # type: ignore[arg-type]
    with pytest.raises(McpConfigError, match="max_minutes works with reward 'code'"):
        await art_mcp.train(
            server, tiny_model, judge=judge_model, reward="ruler", max_minutes=1, max_tokens=8
        )
    with pytest.raises(McpConfigError, match=r"unknown option\(s\) \['rubric'\]"):
        await art_mcp.train(server, tiny_model, scenarios=SCENARIOS, rubric="x", max_tokens=8)
    assert isinstance(load_scenarios(SCENARIOS)[0], CheckedScenario)


# ------------------------------------------------------------------------------ command line


def test_the_command_line_trains_from_a_scenario_file_with_a_warm_start(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    argv = [
        "--stdio",
        f"{sys.executable} {INVENTORY_SERVER_PATH}",
        "--tools",
        ",".join(TOOLS),
        "--model",
        str(tiny_model_dir),
        "--path",
        str(tmp_path / "art"),
        "--scenarios",
        str(subset(SCENARIOS, tmp_path, 8)),
        "--sft",
        str(subset(DEMOS, tmp_path, 4)),
        "--sft-epochs",
        "1",
        "--steps",
        "1",
        "--groups-per-step",
        "1",
        "--rollouts-per-group",
        "2",
        "--max-turns",
        "2",
        "--max-tokens",
        "12",
        "--pool-size",
        "2",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "after the warm start" in out and "Judge" not in out
    assert list((tmp_path / "art").glob("mcp/models/*/report/report.html"))


def test_the_command_line_names_a_bad_scenario_line_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path = tmp_path / "s.jsonl"
    path.write_text('{"task": "t", "answer": 1}\n{"task": "t", "answer": null}\n')
    argv = ["--stdio", "python s.py", "--scenarios", str(path), "--path", str(tmp_path / "art")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"art mcp-train: error: {path}, line 2, field 'answer'" in err
    # Nothing started: no backend folder.
    assert not (tmp_path / "art").exists()
    with pytest.raises(SystemExit):
        cli.parse_args(["--stdio", "python s.py", "--reward", "code"])  # code needs a file
