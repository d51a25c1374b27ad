"""Train an agent on an MCP server: generated scenarios, RULER rewards, GRPO, a report.

`generate_scenarios` describes the server (its tools, resources and prompts) to the shared
scenario generator; `train` runs AutoRL's loop (held-out evaluation at start and end, the
demo's report) with the tool-using agent of `rollout` as the rollout, and adds the MCP failure
counts to each step's metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import art_core as art
from art_mcp._agent import rollout
from art_mcp._context import check_context
from art_mcp._errors import McpServerError
from art_mcp._server import McpServer


async def describe_server(server: McpServer) -> str:
    """A paragraph on what an agent on this server does: its tools, resources and prompts."""
    tools = await server.list_tools()
    lines = [
        f"The agent works with the MCP server {server.label}. Its tools:",
        *(f"- {t.openai_name}: {t.description}" for t in tools),
    ]
    resources = await server.list_resources()
    if resources:
        lines.append("Its resources (data the tasks can be about):")
        lines += [f"- {r.uri}: {r.description or r.name}" for r in resources[:20]]
    prompts = await server.list_prompts()
    if prompts:
        lines.append("Its prompts (typical jobs):")
        lines += [f"- {p.name}: {p.description or ''}" for p in prompts[:20]]
    lines.append(
        "Tasks are requests a user of this server would make that the tools can accomplish."
    )
    return "\n".join(lines)


async def generate_scenarios(
    server: McpServer,
    n: int,
    generator: art.Model | str,
    **options: Any,
) -> list[art.Scenario]:
    """`n` tasks for an agent on `server`, written by `generator` from the server's tools,
    resources and prompts (options go to `art.generate_scenarios`)."""
    description = await describe_server(server)
    tools = [tool.openai_tool() for tool in await server.list_tools()]
    return await art.generate_scenarios(description, n, generator, tools=tools, **options)


async def train(
    server: McpServer,
    model: art.TrainableModel,
    *,
    judge: art.Model | str,
    generator: art.Model | str | None = None,
    steps: int = 10,
    groups_per_step: int = 4,
    rollouts_per_group: int = 4,
    num_scenarios: int = 24,
    scenarios: list[art.Scenario] | None = None,
    max_turns: int = 6,
    max_tokens: int = 256,
    config: art.TrainConfig | None = None,
    report_dir: str | Path | None = None,
    show_progress: bool = True,
    **autorl_options: Any,
) -> art.AutoRLResult:
    """Generate scenarios for `server`, then train `model` on them with RULER rewards; the
    report (if `report_dir`) is the demo's. `model` must be registered.

    Raises `McpContextError` before anything else when the server's tools leave the model no
    room to answer (see `check_context`)."""
    await check_context(model, server, max_tokens=max_tokens)
    if scenarios is None:
        generator = generator or judge
        if show_progress:
            print(f"Generating {num_scenarios} scenarios for {server.label} ...", flush=True)
        scenarios = await generate_scenarios(
            server,
            num_scenarios,
            generator,
            **autorl_options.pop("generation_options", {}),
        )

    async def agent(scenario: art.Scenario, temperature: float) -> art.Trajectory:
        # Counted in the next step's metrics: mcp/failed_rollouts of mcp/rollouts.
        model.pending_metrics["mcp/rollouts"] += 1
        try:
            return await rollout(
                model,
                server,
                scenario,
                max_turns=max_turns,
                max_tokens=max_tokens,
                temperature=temperature,
            )
        except McpServerError:
            # The rollout stays an exception on its group; the run goes on.
            model.pending_metrics["mcp/failed_rollouts"] += 1
            raise

    return await art.autorl(
        await describe_server(server),
        model,
        judge=judge,
        steps=steps,
        groups_per_step=groups_per_step,
        rollouts_per_group=rollouts_per_group,
        scenarios=scenarios,
        config=config,
        report_dir=report_dir,
        show_progress=show_progress,
        rollout=agent,
        title=f"{model.name} on the MCP server {server.label}",
        **autorl_options,
    )
