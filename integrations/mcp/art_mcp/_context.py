"""Does the agent's first request fit the model's context? Asked of the model itself, once.

An MCP server's tool schemas go into every request the agent makes. A server with many tools
can fill a small model's context before the task is even read, and then every rollout fails at
its first turn. `check_context` sends the agent's first request (system prompt, every tool, a
short task, `max_tokens`) once: when the model refuses it as too long, the sizes in its answer
and a second request without the tools say how many tokens the schemas take, a few more
requests measure which tools do fit (`_fit.py`: the rendered prompt of each candidate subset,
never the set that was refused), and `McpContextError` names that subset for `allowed_tools`
and `--tools`, or, when no subset fits, what to do instead.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import openai

import art_core as art
from art_mcp._agent import COMPLETE_TASK, DEFAULT_SYSTEM_PROMPT, tools_that_fit
from art_mcp._errors import McpContextError
from art_mcp._fit import is_context_overflow, overflow_advice, schema_chars
from art_mcp._server import McpServer
from art_mcp._tools import McpTool

_PROBE_TASK = "Check that the tools work."


async def check_context(
    model: art.Model,
    server: McpServer,
    *,
    max_tokens: int = 256,
    system_prompt: str | None = None,
    prefer_tools: Collection[str] = (),
) -> None:
    """Raise `McpContextError` if the agent's first request cannot fit `model`'s context with
    `max_tokens` to answer (one request to the model; a few more when it does not fit, to
    measure which tools do: those named in `prefer_tools`, OpenAI names, are kept first)."""
    tools = await server.list_tools()
    messages = [
        {
            "role": "system",
            "content": system_prompt or DEFAULT_SYSTEM_PROMPT.format(server=server.label),
        },
        {"role": "user", "content": _PROBE_TASK},
    ]
    openai_tools = [tool.openai_tool() for tool in tools] + [COMPLETE_TASK]
    client = model.openai_client()
    try:
        await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,  # type: ignore[arg-type]
            tools=openai_tools,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
        )
        return
    except openai.BadRequestError as error:
        if not is_context_overflow(error):
            raise
        refusal = str(error.message)
    sizes, fit = await tools_that_fit(model, messages, tools, refusal, max_tokens, prefer_tools)
    if sizes is None:
        raise McpContextError(
            f"{model.get_inference_name()} refused the agent's first request as too long for "
            f"its context ({refusal}); it holds the schemas of the {_tools(len(tools))} of "
            f"{server.label}. {overflow_advice(fit, None)}"
        )
    context, prompt_tokens = sizes
    without_tools = await _prompt_tokens_without_tools(client, model, messages)
    if without_tools is None:
        schema_tokens, counted = _estimate(tools, prompt_tokens), "estimated"
    else:
        schema_tokens, counted = prompt_tokens - without_tools, "counted by the model's server"
    raise McpContextError(
        f"The agent's first request does not fit {model.get_inference_name()}'s context of "
        f"{context} tokens: its prompt takes {prompt_tokens} tokens, {schema_tokens} of them "
        f"({counted}) the schemas of the {_tools(len(tools))} of {server.label}, and each turn "
        f"may answer up to max_tokens={max_tokens}. Largest tools (estimated from their share "
        f"of the schema text; the chat template adds its own tokens to each): "
        f"{_largest(tools, schema_tokens)}. {overflow_advice(fit, prompt_tokens)}"
    )


async def _prompt_tokens_without_tools(
    client: openai.AsyncOpenAI, model: art.Model, messages: list[dict[str, Any]]
) -> int | None:
    try:
        response = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,  # type: ignore[arg-type]
            max_tokens=1,
            temperature=0.0,
        )
    except openai.APIError:
        return None  # the estimate will do
    return response.usage.prompt_tokens if response.usage else None


def _estimate(tools: list[McpTool], prompt_tokens: int) -> int:
    """The schemas' share of the prompt, by characters (system prompt and task included)."""
    schema = sum(schema_chars(tool) for tool in tools)
    other = len(DEFAULT_SYSTEM_PROMPT) + len(_PROBE_TASK)
    return round(prompt_tokens * schema / max(schema + other, 1))


def _largest(tools: list[McpTool], schema_tokens: int, shown: int = 5) -> str:
    total = sum(schema_chars(tool) for tool in tools) or 1
    ranked = sorted(tools, key=schema_chars, reverse=True)[:shown]
    return ", ".join(
        f"{tool.name} ~{round(schema_tokens * schema_chars(tool) / total)}" for tool in ranked
    )


def _tools(count: int) -> str:
    return f"{count} tool" if count == 1 else f"{count} tools"
