"""art_mcp.train and `art mcp-train`: scenarios from the server's tools, the tiny model as the
agent on our backend, the scripted server (real HTTP) as generator and judge."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import art_core as art
import art_mcp
from art_mcp import cli
from examples.mcp_servers.inventory_server import create_server
from tests.support.scripted_judge import ScriptedJudge, responder


async def test_generated_scenarios_see_the_servers_tools_resources_and_prompts(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = responder
    server = art_mcp.McpServer.from_object(create_server())
    scenarios = await art_mcp.generate_scenarios(server, 3, judge_model, cache=False)
    assert len(scenarios) == 3
    prompt = scripted_judge.requests[0]["messages"][-1]["content"]
    for name in ("search_items", "update_stock", "inventory://categories", "restocking_plan"):
        assert name in prompt


async def test_train_runs_autorls_loop_with_the_mcp_agent(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    tiny_model: art.TrainableModel,
    tmp_path: Path,
):
    scripted_judge.default = responder
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=["low_stock_report"])
    result = await art_mcp.train(
        server,
        tiny_model,
        judge=judge_model,
        steps=1,
        groups_per_step=2,
        rollouts_per_group=2,
        num_scenarios=6,
        max_turns=2,
        max_tokens=12,
        judge_options={"cache": False},
        report_dir=tmp_path / "report",
        show_progress=False,
    )
    [step] = result.steps
    assert step.step == 1 and step.metrics["groups/submitted"] == 2
    # The held-out rollouts before it and this step's 4: counted, none failed.
    assert step.metrics["mcp/rollouts"] >= 4 and "mcp/failed_rollouts" not in step.metrics
    assert result.before.metrics["failed_rollouts"] == 0
    assert result.report is not None and "MCP server" in result.report.read_text()
    # The judge saw the agent's tools.
    judged = [r for r in scripted_judge.requests if "run_1" in str(r["response_format"])]
    assert "low_stock_report" in judged[0]["messages"][-1]["content"]


def test_the_command_line_needs_exactly_one_server():
    for argv in ([], ["http://127.0.0.1:1/mcp", "--stdio", "python s.py"]):
        with pytest.raises(SystemExit):
            cli.parse_args(argv)
    with pytest.raises(SystemExit):
        cli.parse_args(["http://127.0.0.1:1/mcp", "--header", "no-equals-sign"])


def test_the_command_line_builds_the_server_it_names():
    args = cli.parse_args(["--stdio", f"{sys.executable} -m mcp_server_time", "--tools", "a,b"])
    server = cli.server_from_args(args)
    assert server.label == f"{sys.executable} -m mcp_server_time"
    assert server.allowed_tools == ["a", "b"]
    args = cli.parse_args(["http://127.0.0.1:1/mcp", "--header", "Authorization=Bearer x"])
    assert cli.server_from_args(args).label == "http://127.0.0.1:1/mcp"


def test_art_lists_its_commands_and_names_a_missing_extra(capsys: pytest.CaptureFixture[str]):
    from art_core import cli as art_cli

    assert art_cli.main(["--help"]) == 0
    assert "mcp-train" in capsys.readouterr().out
    assert art_cli.main(["no-such-command"]) == 2
