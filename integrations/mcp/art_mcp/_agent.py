"""The tool-using agent: the OpenAI tool-calling loop against a real MCP server.

Each turn the model sees the server's tools plus `complete_task(summary)`; every tool call it
makes is sent to the server and its result comes back as a tool message. The run ends when the
model calls `complete_task`, answers without a tool call, or runs out of turns. A tool error
or a tool timeout is an observation the model sees; a server that fails (unreachable, crashed,
broken protocol) raises `McpServerError`, which `gather_trajectory_groups` keeps on the group.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection
from typing import Any

import openai

import art_core as art
from art_core.rewards._scenarios import context_sizes
from art_mcp._errors import McpContextError
from art_mcp._fit import ToolFit, fitting_tools, is_context_overflow, overflow_advice
from art_mcp._server import McpServer, McpSession
from art_mcp._tools import McpTool

COMPLETE_TASK = {
    "type": "function",
    "function": {
        "name": "complete_task",
        "description": "Call this when the task is done (or cannot be done), with a short summary "
        "of the outcome for the user.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "What was done."}},
            "required": ["summary"],
        },
    },
}

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that completes the user's task with the tools of the {server} server. "
    "Call tools as needed, read their results, and call complete_task with a short summary "
    "when you are done."
)


async def rollout(
    model: art.Model,
    server: McpServer,
    scenario: str | art.Scenario,
    *,
    max_turns: int = 10,
    max_tokens: int = 256,
    temperature: float = 1.0,
    system_prompt: str | None = None,
    session: McpSession | None = None,
) -> art.Trajectory:
    """One run of the tool-using agent on `scenario`; returns its trajectory (reward 0: score it,
    or let RULER rank the group)."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    task = scenario if isinstance(scenario, str) else scenario.task
    tools = await server.list_tools()
    by_name = {tool.openai_name: tool for tool in tools}
    messages: list[Any] = [
        {
            "role": "system",
            "content": system_prompt or DEFAULT_SYSTEM_PROMPT.format(server=server.label),
        },
        {"role": "user", "content": task},
    ]
    openai_tools = [tool.openai_tool() for tool in tools] + [COMPLETE_TASK]
    counts = {"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0, "truncated_results": 0}
    tool_seconds, logs = 0.0, []
    completed, summary, turns = False, None, 0
    request = {"tools": openai_tools, "max_tokens": max_tokens, "temperature": temperature}

    async with _session(server, session) as live:
        for turns in range(1, max_turns + 1):
            sent = [m if isinstance(m, dict) else _as_dict(m) for m in messages]
            completion = await _turn(model, server, sent, tools, turns, **request)
            choice = completion.choices[0]
            messages.append(choice)
            calls = choice.message.tool_calls or []
            if not calls:
                break  # answered in text: the run is over
            for call in calls:
                name, raw_arguments = call.function.name, call.function.arguments  # type: ignore[union-attr]
                if name == "complete_task":
                    # The run ends on this call: no tool message follows it.
                    completed, summary = True, _summary(raw_arguments)
                    continue
                counts["tool_calls"] += 1
                text, failed, seconds = await _call(
                    live, by_name.get(name), name, raw_arguments, counts
                )
                tool_seconds += seconds
                if failed:
                    counts["tool_errors"] += 1
                    logs.append(f"turn {turns}: {name}: {text[:300]}")
                messages.append(_tool_message(call.id, text))
            if completed:
                break
    ran_out = not completed and turns == max_turns and bool(choice.message.tool_calls)
    metrics: dict[str, float | int | bool] = {
        "num_turns": turns,
        **counts,
        "ran_out_of_turns": ran_out,
        "task_completed": completed,
        "tool_seconds": round(tool_seconds, 4),
    }
    return art.Trajectory(
        messages_and_choices=messages,
        tools=openai_tools,
        metrics=metrics,
        metadata={
            "scenario": task,
            "mcp_server": server.label,
            **({"summary": summary} if summary is not None else {}),
        },
        logs=logs,
    )


async def _turn(
    model: art.Model,
    server: McpServer,
    messages: list[dict[str, Any]],
    offered: list[McpTool],
    turn: int,
    /,
    **request: Any,
) -> Any:
    """One turn's completion (`request`: its tools, max_tokens, temperature); a refusal as too
    long for the context raises `McpContextError` naming the tools that would fit."""
    try:
        return await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,  # type: ignore[arg-type]
            **request,
        )
    except openai.BadRequestError as error:
        if not is_context_overflow(error):
            raise
        refusal = str(error.message)
        raise await _context_error(
            model, server, messages, offered, request["max_tokens"], turn, refusal
        ) from error


async def tools_that_fit(
    model: art.Model,
    messages: list[dict[str, Any]],
    tools: list[McpTool],
    refusal: str,
    max_tokens: int,
    prefer: Collection[str] = (),
) -> tuple[tuple[int, int] | None, ToolFit]:
    """After the model refused `messages` with `tools` as too long: the sizes its refusal names
    (context, prompt tokens; None when it names none) and the agent's tools that would fit
    (`_fit.fitting_tools`, those in `prefer` first)."""
    sizes = context_sizes(refusal)
    fit = await fitting_tools(
        model.openai_client(),
        model.get_inference_name(),
        messages,
        tools,
        extra_tools=[COMPLETE_TASK],
        max_tokens=max_tokens,
        context=sizes[0] if sizes else None,
        prefer=prefer,
    )
    return sizes, fit


async def _call(
    session: McpSession,
    tool: McpTool | None,
    name: str,
    raw_arguments: str,
    counts: dict[str, int],
) -> tuple[str, bool, float]:
    """(tool message text, failed, seconds) for one call the model made."""
    if tool is None:
        return f"Tool error: there is no tool named {name!r}.", True, 0.0
    try:
        arguments = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as error:
        return f"Tool error: the arguments are not valid JSON ({error.msg}).", True, 0.0
    if not isinstance(arguments, dict):
        return "Tool error: the arguments must be a JSON object.", True, 0.0
    outcome = await session.call_tool(tool, arguments)
    counts["tool_timeouts"] += outcome.timed_out
    counts["truncated_results"] += outcome.truncated
    return outcome.text, outcome.is_error, outcome.seconds


async def _context_error(
    model: art.Model,
    server: McpServer,
    messages: list[dict[str, Any]],
    tools: list[McpTool],
    max_tokens: int,
    turn: int,
    refusal: str,
) -> McpContextError:
    """The model refused a turn as too long: which tools would fit, measured on this very
    prompt (`_fit.py`), as an `allowed_tools` hint."""
    sizes, fit = await tools_that_fit(model, messages, tools, refusal, max_tokens)
    size = (
        f"context of {sizes[0]} tokens: the prompt takes {sizes[1]} tokens, with "
        f"max_tokens={max_tokens} to answer"
        if sizes
        else f"context ({refusal})"
    )
    grown = (
        f" The conversation grew over {turn - 1} turns of tool calls and results: a lower "
        "max_turns, or McpServer(..., max_result_chars=...) for shorter results, helps too."
        if turn > 1
        else ""
    )
    return McpContextError(
        f"Turn {turn} of the rollout does not fit {model.get_inference_name()}'s {size}; it "
        f"offers {len(tools)} tool(s) of {server.label}.{grown} "
        f"{overflow_advice(fit, sizes[1] if sizes else None)}"
    )


def _session(server: McpServer, session: McpSession | None) -> Any:
    if session is not None:
        return contextlib.nullcontext(session)
    return server.session()


def _summary(raw_arguments: str) -> str:
    try:
        value = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError:
        return raw_arguments
    return str(value.get("summary", "")) if isinstance(value, dict) else str(value)


def _tool_message(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _as_dict(choice: Any) -> dict[str, Any]:
    return choice.message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
