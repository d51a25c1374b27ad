"""Checkable scenarios and scripted demonstrations for the inventory server (`art mcp-train`).

Writes, next to this file:
- `inventory_scenarios.jsonl`: 90 read-only questions about the seeded store, each with its
  answer and the tool call that finds it (the quantity or price of an item by SKU, the
  quantity of an item by name);
- `inventory_demos.jsonl`: what a scripted policy does on some of the training scenarios (never
  on held-out ones: the split is the one `art_mcp.train` makes, `val_fraction=0.25`), run
  against the real server so every tool result is what the agent will see. The lines have no
  system message and no tools: `art_mcp.train` gives them the agent's, whatever the transport.

    python examples/mcp_servers/inventory_tasks.py [--demos 36]

Then (from the repository root):

    art mcp-train --stdio ".venv/bin/python examples/mcp_servers/inventory_server.py" \\
        --tools search_items,get_item --scenarios examples/mcp_servers/inventory_scenarios.jsonl \\
        --sft examples/mcp_servers/inventory_demos.jsonl

Measured (2 cores, SmolLM2-135M-Instruct, load average 1.5-1.8; the full command in the
docs/mcp.md, `--max-minutes 13.5`): held-out reward 0.023 at the start, 0.659 after
the warm start (36 demonstrations x 2 epochs, 243 s), 0.659 after 4 RL steps; 13 min 50 s in
all, over stdio. Over HTTP the same path ran as a shorter check (see docs/mcp.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import art_core as art  # noqa: E402
import art_mcp  # noqa: E402
from art_mcp._checked import CheckedScenario, parse_scenario  # noqa: E402
from examples.mcp_servers.inventory_server import SEED_ITEMS, create_server  # noqa: E402

SCENARIOS_FILE = HERE / "inventory_scenarios.jsonl"
DEMOS_FILE = HERE / "inventory_demos.jsonl"
TOOLS = ["search_items", "get_item"]
VAL_FRACTION = 0.25


def scenario_lines() -> list[dict[str, Any]]:
    """One line per (item, question kind): the task, its answer, the call that finds it."""
    lines: list[dict[str, Any]] = []
    for sku, name, _category, price, quantity in SEED_ITEMS:
        by_sku = {"name": "get_item", "arguments": {"sku": sku}}
        lines.append(
            {
                "task": f"How many units of {sku} are in stock?",
                "answer": quantity,
                "tool_calls": [by_sku],
            }
        )
        lines.append(
            {"task": f"What is the price of {sku}?", "answer": price, "tool_calls": [by_sku]}
        )
        lines.append(
            {
                "task": f"How many units of {name} do we have?",
                "answer": quantity,
                "tool_calls": ["search_items"],
                "difficulty": 2,
            }
        )
    return lines


def script(scenario: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """The scripted policy: (tool, arguments, summary template) for one scenario line."""
    task: str = scenario["task"]
    if task.startswith("How many units of ") and task.endswith(" are in stock?"):
        sku = task.removeprefix("How many units of ").removesuffix(" are in stock?")
        return "get_item", {"sku": sku}, "{sku} ({name}): {quantity} units in stock."
    if task.startswith("What is the price of "):
        sku = task.removeprefix("What is the price of ").removesuffix("?")
        return "get_item", {"sku": sku}, "{sku} ({name}) costs ${price:.2f}."
    name = task.removeprefix("How many units of ").removesuffix(" do we have?")
    return "search_items", {"query": name}, "{name} ({sku}): {quantity} units in stock."


async def demonstration(session: art_mcp.McpSession, tools: dict[str, Any], line: dict[str, Any]):  # type: ignore[no-untyped-def]
    """One conversation of the scripted policy, with the real server's tool result."""
    tool, arguments, template = script(line)
    outcome = await session.call_tool(tools[tool], arguments)
    data = json.loads(outcome.text)
    item = data["items"][0] if "items" in data else data
    call = {"id": "call_1", "type": "function"}
    return {
        "messages": [
            {"role": "user", "content": line["task"]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {**call, "function": {"name": tool, "arguments": json.dumps(arguments)}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": outcome.text},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {
                            "name": "complete_task",
                            "arguments": json.dumps({"summary": template.format(**item)}),
                        },
                    }
                ],
            },
        ]
    }


async def main(demos: int) -> None:
    """Write both files; print how many lines each has."""
    lines = scenario_lines()
    SCENARIOS_FILE.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scenarios = [parse_scenario(json.dumps(line)) for line in lines]
    train, _val = art.split_scenarios(list[art.Scenario](scenarios), VAL_FRACTION)
    train_tasks = {s.task for s in train if isinstance(s, CheckedScenario)}
    # The lines go item by item, three kinds each, so the first N cover every kind.
    chosen = [line for line in lines if line["task"] in train_tasks][:demos]
    server = art_mcp.McpServer.from_object(create_server(), allowed_tools=TOOLS)
    async with server:
        tools = {tool.openai_name: tool for tool in await server.list_tools()}
        async with server.session() as session:
            written = [await demonstration(session, tools, line) for line in chosen]
    DEMOS_FILE.write_text("".join(json.dumps(demo) + "\n" for demo in written))
    print(f"{SCENARIOS_FILE}: {len(lines)} scenarios ({len(train)} train)")
    print(f"{DEMOS_FILE}: {len(written)} demonstrations")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", type=int, default=36)
    asyncio.run(main(parser.parse_args().demos))
