"""Which of the offered tools fit the model's context: measured by the model's server.

A tool costs more in the rendered prompt than its schema's text (the chat template wraps each
tool, and the conversation around them), so per-tool estimates made alone do not add up for a
subset. `fitting_tools` asks the model's server instead. Tools are taken smallest first (those in
`prefer`, the tools the scenarios call, before the rest while they fit together), and a binary
search over how many finds the longest such prefix whose rendered prompt leaves `max_tokens` to
answer: one request per try with `max_tokens=1`, whose `usage.prompt_tokens` (or, refused, its
error's sizes) is the server's own count; about log2(n) + 1 requests. The set that was refused
is never the answer: at most n - 1 tools.

When the server's refusals do not say the context size, a try is the real request (with
`max_tokens`): accepted means it fits. `overflow_advice` turns the result into what to do.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import openai

from art_core.rewards._scenarios import context_sizes
from art_mcp._tools import McpTool

_CONTEXT_OVERFLOW = ("context length", "context window", "context of", "prompt is too long")


def is_context_overflow(error: openai.BadRequestError) -> bool:
    """Whether the model's server refused a request as too long for its context."""
    return any(words in str(error.message).lower() for words in _CONTEXT_OVERFLOW)


def schema_chars(tool: McpTool) -> int:
    """The length of the tool's OpenAI schema as sent: a proxy for its size, to order tools."""
    return len(json.dumps(tool.openai_tool(), ensure_ascii=False))


@dataclass(frozen=True)
class ToolFit:
    """What the measure found: the tools that fit and the server's counts behind it."""

    offered: list[McpTool]
    tools: list[McpTool]  # the largest fitting subset (never all of `offered`); may be empty
    max_tokens: int
    context: int | None  # the model's context, when its refusals say it
    prompt_tokens: int | None  # the rendered prompt with `tools`, when they fit and were counted
    next_tool: McpTool | None  # the first tool left out: with it the prompt does not fit
    next_tokens: int | None  # the prompt with `next_tool` too, when counted
    bare_fits: bool  # whether the prompt without any of the server's tools fits
    bare_tokens: int | None  # that prompt's tokens, when it was measured
    needed_left_out: list[str]  # MCP names of `prefer` tools the subset could not hold

    @property
    def names(self) -> list[str]:
        """The MCP names of the fitting tools (what `allowed_tools` and `--tools` take)."""
        return [tool.name for tool in self.tools]


class _Measure:
    """Tries one tool subset at a time against the model's server."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model_name: str,
        messages: list[dict[str, Any]],
        extra_tools: list[dict[str, Any]],
        max_tokens: int,
        context: int | None,
    ) -> None:
        self.client, self.model_name, self.messages = client, model_name, messages
        self.extra_tools, self.max_tokens, self.context = extra_tools, max_tokens, context
        self.tokens: dict[int, int | None] = {}  # prefix length -> counted prompt tokens

    async def fits(self, tools: list[McpTool]) -> bool:
        counted = await self._prompt_tokens(tools) if self.context is not None else None
        self.tokens[len(tools)] = counted
        if counted is not None and self.context is not None:
            return counted + self.max_tokens <= self.context
        # No count or no context size: the real request says.
        return await self._accepted(tools, self.max_tokens)

    async def _prompt_tokens(self, tools: list[McpTool]) -> int | None:
        try:
            response = await self._request(tools, 1)
        except openai.BadRequestError as error:
            if not is_context_overflow(error):
                raise
            sizes = context_sizes(str(error.message))
            return sizes[1] if sizes else None
        return response.usage.prompt_tokens if response.usage else None

    async def _accepted(self, tools: list[McpTool], max_tokens: int) -> bool:
        try:
            await self._request(tools, max_tokens)
        except openai.BadRequestError as error:
            if not is_context_overflow(error):
                raise
            sizes = context_sizes(str(error.message))
            if sizes is not None:
                self.context = self.context or sizes[0]
                self.tokens[len(tools)] = sizes[1]
            return False
        return True

    async def _request(self, tools: list[McpTool], max_tokens: int) -> Any:
        return await self.client.chat.completions.create(
            model=self.model_name,
            messages=self.messages,  # type: ignore[arg-type]
            tools=[tool.openai_tool() for tool in tools] + self.extra_tools,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
        )


async def fitting_tools(
    client: openai.AsyncOpenAI,
    model_name: str,
    messages: list[dict[str, Any]],
    offered: list[McpTool],
    *,
    extra_tools: list[dict[str, Any]],
    max_tokens: int,
    context: int | None,
    prefer: Collection[str] = (),
) -> ToolFit:
    """The largest set of the smallest `offered` tools (those whose OpenAI names are in `prefer`
    first, when they fit together) with which `messages` and `max_tokens` fit the model's
    context, measured on the server (module doc). `offered` itself is known not to fit."""
    smallest_first = sorted(offered, key=schema_chars)
    measure = _Measure(client, model_name, messages, extra_tools, max_tokens, context)
    if prefer:
        preferred = sorted(smallest_first, key=lambda tool: tool.openai_name not in prefer)
        fit = await _longest_prefix(measure, offered, preferred, prefer)
        if not fit.needed_left_out or not fit.bare_fits:
            return fit
        # The tools the scenarios call do not fit together: the most tools that do, instead.
        measure = _Measure(client, model_name, messages, extra_tools, max_tokens, measure.context)
    return await _longest_prefix(measure, offered, smallest_first, prefer)


async def _longest_prefix(
    measure: _Measure, offered: list[McpTool], ranked: list[McpTool], prefer: Collection[str]
) -> ToolFit:
    """The longest prefix of `ranked` that fits, by binary search (`ranked` whole does not)."""
    fitting, refused = -1, len(ranked)  # -1: not even the bare prompt is known to fit
    while refused - fitting > 1:
        middle = (fitting + refused) // 2
        if await measure.fits(ranked[:middle]):
            fitting = middle
        else:
            refused = middle
    kept = max(fitting, 0)
    return ToolFit(
        offered=offered,
        tools=ranked[:kept],
        max_tokens=measure.max_tokens,
        context=measure.context,
        prompt_tokens=measure.tokens.get(fitting),
        next_tool=ranked[kept] if ranked else None,
        next_tokens=measure.tokens.get(kept + 1),
        bare_fits=fitting >= 0,
        bare_tokens=measure.tokens.get(0),
        needed_left_out=[tool.name for tool in ranked[kept:] if tool.openai_name in prefer],
    )


def overflow_advice(fit: ToolFit, full_prompt_tokens: int | None) -> str:
    """What to do, from the measure: the fitting subset as `allowed_tools=[...]` and `--tools`,
    else shorter descriptions, a lower `max_tokens` or a longer context."""
    context, n = fit.context, len(fit.offered)
    if fit.tools:
        counted = (
            f" (measured: the prompt with them takes {fit.prompt_tokens} tokens, and with "
            f"max_tokens={fit.max_tokens} it fits the context of {context})"
            if fit.prompt_tokens is not None and context is not None
            else " (measured: the model's server accepts the request with them)"
        )
        some = f"{len(fit.tools)} of the {n} tools " + ("fits" if len(fit.tools) == 1 else "fit")
        needed = (
            f" It leaves out {', '.join(fit.needed_left_out)}, which the scenarios call: "
            "their checks of those calls could not pass."
            if fit.needed_left_out
            else ""
        )
        return (
            f"{some}{counted}: offer only those with McpServer(..., allowed_tools="
            f"{fit.names!r}) or `art mcp-train --tools {','.join(fit.names)}`"
            f"{_lower(context, full_prompt_tokens)}; or use a model with a longer context.{needed}"
        )
    if not fit.bare_fits:
        bare = f" ({fit.bare_tokens} tokens)" if fit.bare_tokens is not None else ""
        lower = _lower(context, full_prompt_tokens) or _lower(context, fit.bare_tokens)
        return (
            f"Not even the prompt without any of the server's tools{bare} fits with "
            f"max_tokens={fit.max_tokens}: offering fewer tools cannot help. Shorten the "
            f"system prompt or the task{lower}; or use a model with a longer context."
        )
    first = fit.next_tool.name if fit.next_tool is not None else "?"
    alone = (
        f" (with {first} alone the prompt takes {fit.next_tokens} tokens)"
        if fit.next_tokens is not None
        else ""
    )
    lower = _lower(context, full_prompt_tokens) or _lower(context, fit.next_tokens, f" for {first}")
    return (
        f"Not even one tool fits beside max_tokens={fit.max_tokens}{alone}: no subset of "
        f"the {n} tools fits. Give shorter tool descriptions and schemas (on the server)"
        f"{lower}; or use a model with a longer context."
    )


def _lower(context: int | None, prompt_tokens: int | None, what: str = "") -> str:
    """The advice to lower max_tokens to what leaves room for a prompt of `prompt_tokens`."""
    if context is None or prompt_tokens is None or prompt_tokens >= context:
        return ""
    return f"; or lower max_tokens to at most {context - prompt_tokens}{what}"
