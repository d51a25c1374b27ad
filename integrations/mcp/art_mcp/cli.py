"""`art mcp-train`: train a model on any MCP server from the command line.

    art mcp-train http://127.0.0.1:8765/mcp --steps 4
    art mcp-train --stdio "python examples/mcp_servers/inventory_server.py" --judge openai/gpt-4.1-mini
    art mcp-train --stdio "python examples/mcp_servers/inventory_server.py" \
        --scenarios examples/mcp_servers/inventory_scenarios.jsonl \
        --sft examples/mcp_servers/inventory_demos.jsonl

The backend starts on this machine (LocalBackend). With a scenario file (`--scenarios FILE`,
answers a code check can verify) the reward is code by default and needs no judge; with
generated scenarios the judge and the generator default to the base model it serves, so it runs
offline. A stronger judge gives better rewards.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from pathlib import Path

import art_core as art
from art_core._arguments import flag_values
from art_core.report import print_summary
from art_core.utils.sft import get_file_row_count
from art_mcp._checked import check_offered_tools, load_scenarios
from art_mcp._server import McpServer
from art_mcp._train import train

# The flags handed to `art_mcp.train` under their own names.
RUN_FLAGS = (
    "generator steps groups_per_step rollouts_per_group num_scenarios reward sft sft_epochs "
    "sft_learning_rate val_fraction max_minutes max_turns max_tokens"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="art mcp-train",
        description="Train an agent against an MCP server (code-checked or RULER rewards).",
    )
    parser.add_argument("url", nargs="?", help="the server's streamable HTTP URL (.../mcp)")
    parser.add_argument("--stdio", help='a command that serves MCP on stdio, e.g. "python s.py"')
    parser.add_argument("--header", action="append", default=[], help="HTTP header KEY=VALUE")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the base model")
    parser.add_argument("--name", help="the trained model's name (default: a new one per run)")
    parser.add_argument("--project", default="mcp")
    parser.add_argument("--judge", help="provider/model (e.g. openai/gpt-4.1-mini); default: base")
    parser.add_argument("--generator", help="provider/model for scenarios; default: the judge")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument(
        "--scenarios",
        default="16",
        help="N scenarios to generate (default 16), or a JSONL file of scenarios with "
        'checkable answers, one a line: {"task": ..., "answer": ..., "tool_calls": [...]}',
    )
    parser.add_argument(
        "--reward",
        choices=["code", "ruler", "both"],
        help="code: the scenario file's checks; ruler: the judge ranks each group; both: their "
        "mean (default: code with a scenario file, else ruler)",
    )
    parser.add_argument(
        "--sft", help="warm start: a JSONL file of demonstrations (OpenAI messages)"
    )
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument("--sft-learning-rate", type=float, default=5e-4)
    parser.add_argument("--val-fraction", type=float, default=0.25, help="held-out share")
    parser.add_argument(
        "--max-minutes",
        type=float,
        help="code/both rewards: start no step that would end (with the last evaluation) later",
    )
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--tools", help="comma-separated tool names to offer (default: all)")
    parser.add_argument("--pool-size", type=int, default=0, help="0: a session per rollout")
    parser.add_argument("--call-timeout", type=float, default=30.0)
    parser.add_argument("--path", default=".art")
    args = parser.parse_args(argv)
    if bool(args.url) == bool(args.stdio):
        parser.error("give the server's URL, or --stdio with the command that starts it")
    if any("=" not in header for header in args.header):
        parser.error("--header takes KEY=VALUE")
    if args.scenarios.isdigit():
        args.num_scenarios, args.scenario_file = int(args.scenarios), None
    else:
        args.num_scenarios, args.scenario_file = 0, args.scenarios
        if args.reward in ("code", None) and args.generator:
            parser.error("--generator writes scenarios; a scenario file needs none")
    if args.reward in ("code", "both") and args.scenario_file is None:
        parser.error(f"--reward {args.reward} needs --scenarios FILE (answers to check)")
    return args


def server_from_args(args: argparse.Namespace) -> McpServer:
    options = {
        "pool_size": args.pool_size,
        "call_timeout": args.call_timeout,
        "allowed_tools": args.tools.split(",") if args.tools else None,
    }
    if args.url:
        headers = dict(header.split("=", 1) for header in args.header)
        return McpServer.from_url(args.url, headers=headers, **options)
    command, *command_args = shlex.split(args.stdio)
    return McpServer.from_command(command, command_args, **options)


async def run(args: argparse.Namespace) -> art.AutoRLResult:
    server = server_from_args(args)
    # Read before the backend starts: a bad line fails in a second, naming line and field.
    scenarios = load_scenarios(args.scenario_file) if args.scenario_file else None
    if scenarios is not None:
        # Before the backend too: a check calling a tool --tools leaves out could never pass.
        async with server:
            offered = await server.list_tools()
        check_offered_tools(scenarios, offered, all_of_server=args.tools is None)
    if args.sft:
        get_file_row_count(args.sft)  # every line checked; InvalidSFTFileError names a bad one
    backend = art.LocalBackend(path=args.path)
    name = args.name or time.strftime("mcp-%Y%m%d-%H%M%S")
    model = art.TrainableModel(name=name, project=args.project, base_model=args.model)
    print(f"Starting the backend ({args.model}) under {args.path}/ ...", flush=True)
    await model.register(backend)
    judge = None
    # A judge ranks groups (ruler, both) and writes scenarios when there is no file.
    if args.reward in ("ruler", "both") or args.scenario_file is None:
        judge = await art.judge_or_base_model(args.judge, backend, args.model)
        if not args.judge:
            print("Judge: the base model itself (offline). A stronger judge gives better rewards.")
    try:
        async with server:
            tools = await server.list_tools()
            print(f"{server.label}: {len(tools)} tools: {', '.join(t.name for t in tools)}")
            result = await train(
                server,
                model,
                judge=judge,
                scenarios=scenarios,
                config=art.TrainConfig(learning_rate=args.learning_rate),
                report_dir=Path(args.path) / args.project / "models" / name / "report",
                **flag_values(args, RUN_FLAGS),
            )
    finally:
        await backend.close()
    print_summary(result.before, result.after, result.report)
    if "held_out_after_sft" in result.settings:
        print(
            f"\nHeld-out reward: {result.before.metrics['reward']:.3f} at the start, "
            f"{result.settings['held_out_after_sft']:.3f} after the warm start, "
            f"{result.after.metrics['reward']:.3f} after RL"
        )
    if judge is not None:
        print(f"\nJudge and generator: {result.judge_usage.summary()}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of `art mcp-train`: 0 when trained; 1 with a one-line error when the run
    cannot go on for a reason the user can fix (an `art.ArtError`: the server, the generator,
    the context); 2 for a malformed command line (argparse's convention)."""
    args = parse_args(argv)
    try:
        asyncio.run(run(args))
    except art.ArtError as error:
        # The message says what to do; a traceback would bury it. Bugs still show theirs.
        print(f"art mcp-train: error: {error}", file=sys.stderr)
        return 1
    return 0
