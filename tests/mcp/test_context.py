"""Tools that do not fit the model's context: `check_context` (so `art mcp-train`) and `rollout`
name a subset of the offered tools that fits, measured on the model's own count of the rendered
prompt, never the set that was refused; when none fits they say what to do instead.

The policy is scripted on 127.0.0.1 (real HTTP, the real `openai` client) with a chat template
that costs more than its tools' text: each tool is wrapped in `TEMPLATE_TOKENS_PER_TOOL` tokens
of its own, so per-tool estimates from the schema text alone do not add up for a subset.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

import art_core as art
import art_mcp
from examples.mcp_servers.inventory_server import create_server
from tests.support.scripted_judge import Reply, call

CONTEXT = 1000
TEMPLATE_TOKENS_PER_TOOL = 60
# name -> description length: four tools from small to large.
TOOL_SIZES = {"ping": 20, "lookup": 160, "report": 480, "export": 1200}


def catalogue_server() -> MCPServer:
    """An MCP server whose four tools differ only in the length of their descriptions."""
    server = MCPServer("catalogue")
    for name, size in TOOL_SIZES.items():

        def tool(query: str) -> str:
            return f"result for {query}"

        server.add_tool(tool, name=name, description=(f"{name} the catalogue. " * 100)[:size])
    return server


def rendered_tokens(body: dict[str, Any]) -> int:
    """The scripted model's count of a request's prompt: 4 characters a token, plus the
    template's own tokens around the conversation and around every tool."""
    text = sum(len(json.dumps(message.get("content"))) for message in body["messages"])
    tools = body.get("tools") or []
    schemas = sum(len(json.dumps(tool)) for tool in tools)
    return 30 + (text + schemas) // 4 + TEMPLATE_TOKENS_PER_TOOL * len(tools)


def small_context(body: dict[str, Any]) -> Reply:
    """A model with a context of `CONTEXT` tokens that refuses, as vLLM does, a request whose
    prompt and `max_tokens` do not fit; otherwise it completes the task."""
    prompt, answer = rendered_tokens(body), body.get("max_tokens") or 16
    if prompt + answer > CONTEXT:
        return Reply(
            status=400,
            message=f"This model's maximum context length is {CONTEXT} tokens. However, you "
            f"requested {prompt + answer} tokens ({prompt} in the messages, {answer} in the "
            "completion). Please reduce the length of the messages or completion.",
        )
    reply = call("complete_task", {"summary": "done"})
    reply.usage = (prompt, 1)
    return reply


def suggested_tools(message: str) -> list[str]:
    """The tool set an overflow message suggests (its `--tools a,b` or `allowed_tools=[...]`)."""
    if found := re.search(r"--tools ([^\s`]+)", message):
        return found.group(1).split(",")
    found = re.search(r"allowed_tools=(\[[^\]]*\])", message)
    assert found, message
    return list(ast.literal_eval(found.group(1)))


async def fits(model: art.Model, tools: list[str], max_tokens: int) -> bool:
    server = art_mcp.McpServer.from_object(catalogue_server(), allowed_tools=tools)
    try:
        await art_mcp.check_context(model, server, max_tokens=max_tokens)
    except art_mcp.McpContextError:
        return False
    return True


@pytest.fixture
def small_model(policy) -> art.Model:  # type: ignore[no-untyped-def]
    scripted, model = policy
    scripted.default = small_context
    return model


# ------------------------------------------------------------------- check_context (the CLI)


async def test_the_suggested_tools_are_never_the_set_that_was_given(small_model: art.Model):
    """Two tools offered, together too large: the suggestion is one of them, and it fits (the
    advice once echoed `--tools lookup,report`, the very set that was refused)."""
    given = ["lookup", "report"]
    assert not await fits(small_model, given, max_tokens=500)
    server = art_mcp.McpServer.from_object(catalogue_server(), allowed_tools=given)
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(small_model, server, max_tokens=500)
    suggestion = suggested_tools(str(caught.value))
    assert suggestion and set(suggestion) < set(given)
    assert await fits(small_model, suggestion, max_tokens=500)
    assert f"allowed_tools={suggestion!r}" in str(caught.value)


async def test_the_suggestion_is_measured_on_the_rendered_prompt_not_added_up(
    small_model: art.Model,
):
    """Each tool costs its template's tokens on top of its text: the subset named fits once
    rendered, and adding any other offered tool to it would not."""
    server = art_mcp.McpServer.from_object(catalogue_server())
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(small_model, server, max_tokens=400)
    message = str(caught.value)
    suggestion = suggested_tools(message)
    assert 0 < len(suggestion) < len(TOOL_SIZES)
    assert await fits(small_model, suggestion, max_tokens=400)
    for other in set(TOOL_SIZES) - set(suggestion):
        assert not await fits(small_model, [*suggestion, other], max_tokens=400), other
    assert "measured" in message and f"context of {CONTEXT} tokens" in message
    # The prompt alone is over the context: a lower max_tokens cannot help, so none is offered.
    assert "lower max_tokens" not in message


async def test_the_tools_the_scenarios_call_are_kept_first_while_they_fit(small_model: art.Model):
    server = art_mcp.McpServer.from_object(catalogue_server())
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(small_model, server, max_tokens=400, prefer_tools={"report"})
    assert suggested_tools(str(caught.value)) == ["report", "ping"]
    # "export" alone leaves no room to answer: the most tools that fit, and a word on it.
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(small_model, server, max_tokens=400, prefer_tools={"export"})
    message = str(caught.value)
    assert suggested_tools(message) == ["ping", "lookup"]
    assert "It leaves out export, which the scenarios call" in message


async def test_when_no_tool_fits_the_message_says_what_to_do_instead(small_model: art.Model):
    """The smallest tool alone does not fit: no `--tools` to suggest; shorter descriptions, a
    lower max_tokens or a longer context."""
    server = art_mcp.McpServer.from_object(catalogue_server(), allowed_tools=["lookup", "report"])
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(small_model, server, max_tokens=700)
    message = str(caught.value)
    assert "--tools" not in message and "allowed_tools=[" not in message
    assert "no subset of the 2 tools fits" in message
    assert "shorter tool descriptions" in message and "longer context" in message
    assert "lower max_tokens to at most" in message


async def test_when_not_even_the_bare_prompt_fits_it_says_so(small_model: art.Model):
    server = art_mcp.McpServer.from_object(catalogue_server(), allowed_tools=["ping"])
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(small_model, server, max_tokens=950)
    message = str(caught.value)
    assert "--tools" not in message and "without any of the server's tools" in message
    assert "lower max_tokens to at most" in message and "longer context" in message


async def test_a_server_that_gives_no_sizes_is_measured_by_its_answers(policy):
    """Its refusals say neither the context nor the prompt's size: each candidate subset is
    tried as the real request, and the one it accepts is named."""
    scripted, model = policy

    def vague(body: dict[str, Any]) -> Reply:
        reply = small_context(body)
        if reply.status == 400:
            reply.message = "prompt is too long for this model"
        return reply

    scripted.default = vague
    server = art_mcp.McpServer.from_object(catalogue_server())
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(model, server, max_tokens=400)
    message = str(caught.value)
    assert "prompt is too long" in message
    assert suggested_tools(message) == ["ping", "lookup"]
    assert "the model's server accepts the request with them" in message


async def test_the_tiny_models_suggestion_fits_it(tiny_model: art.TrainableModel):
    """On the real backend (a 2048-token context, its own chat template): the inventory
    server's five tools do not fit beside 1000 tokens; the subset named does."""
    server = art_mcp.McpServer.from_object(create_server())
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(tiny_model, server, max_tokens=1000)
    suggestion = suggested_tools(str(caught.value))
    assert 0 < len(suggestion) < 5
    narrow = art_mcp.McpServer.from_object(create_server(), allowed_tools=suggestion)
    await art_mcp.check_context(tiny_model, narrow, max_tokens=1000)


# -------------------------------------------------------------------------------- rollout


async def test_a_rollout_that_overflows_names_allowed_tools_with_a_subset_that_fits(
    small_model: art.Model,
):
    server = art_mcp.McpServer.from_object(catalogue_server())
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.rollout(small_model, server, "Export the catalogue.", max_tokens=400)
    message = str(caught.value)
    assert "allowed_tools=[" in message and "Turn 1 of the rollout" in message
    suggestion = suggested_tools(message.split("--tools")[0])
    assert 0 < len(suggestion) < len(TOOL_SIZES)
    narrow = art_mcp.McpServer.from_object(catalogue_server(), allowed_tools=suggestion)
    trajectory = await art_mcp.rollout(small_model, narrow, "Export the catalogue.", max_tokens=400)
    assert trajectory.metrics["task_completed"]


async def test_a_rollout_refused_for_another_reason_is_not_a_context_error(policy):
    scripted, model = policy
    scripted.queue(Reply(status=400, message="tool_choice is not supported"))
    server = art_mcp.McpServer.from_object(catalogue_server(), allowed_tools=["ping"])
    with pytest.raises(Exception) as caught:
        await art_mcp.rollout(model, server, "Ping.")
    assert not isinstance(caught.value, art_mcp.McpContextError)
