"""Scenarios for an agent on an MCP server, written by a generator model: from the server
itself (ours), or from a list of its tools and resources (ART's `art.mcp` form).

    scenarios = await art_mcp.generate_scenarios(server, 24, judge)       # ours: list[art.Scenario]
    collection = await generate_scenarios(                              # ART's (`art.mcp`)
        tools=tools_list, resources=[], num_scenarios=24, show_preview=True,
        generator_model="openai/gpt-4.1-mini", generator_api_key=KEY, generator_base_url=URL,
    )                                                                   # GeneratedScenarioCollection

Both describe the tools (and resources) to the shared generator, `art.generate_scenarios`, which
validates, deduplicates and asks again until there are enough. ART's tools are whatever its
callers pass: our `McpTool`s, the MCP SDK's `Tool`s (or its `list_tools()` result), ART's
`MCPTool` objects, or dicts (`name`, `description`, `parameters` / `inputSchema`, or an OpenAI
tool). ART's generator is a LiteLLM name: with `generator_base_url` it is sent to that
OpenAI-compatible URL as written (OpenRouter's ids read `openai/gpt-4.1-mini`, our art-server's
`<name>`); without, `"<provider>/<model>"` is resolved as our judges are (`art.resolve_model`),
with `generator_api_key` in place of the provider's key variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

import art_core as art
from art_mcp._collection import GeneratedScenarioCollection, print_preview
from art_mcp._errors import McpConfigError
from art_mcp._server import McpServer
from art_mcp._tools import McpTool, openai_parameters

DEFAULT_COUNT = 24  # ART's num_scenarios
DEFAULT_GENERATOR = "openai/gpt-4.1-mini"  # ART's generator_model
SHOWN_RESOURCES = 20
PREVIEWED = 5  # ART previews the first five


async def describe_server(server: McpServer) -> str:
    """A paragraph on what an agent on this server does: its tools, resources and prompts."""
    tools = await server.list_tools()
    lines = [
        f"The agent works with the MCP server {server.label}. Its tools:",
        *(f"- {t.openai_name}: {t.description}" for t in tools),
        *_resource_lines(await server.list_resources()),
    ]
    prompts = await server.list_prompts()
    if prompts:
        lines.append("Its prompts (typical jobs):")
        lines += [f"- {p.name}: {p.description or ''}" for p in prompts[:SHOWN_RESOURCES]]
    lines.append(
        "Tasks are requests a user of this server would make that the tools can accomplish."
    )
    return "\n".join(lines)


async def scenarios_for_server(
    server: McpServer, n: int, generator: art.Model | str, **options: Any
) -> list[art.Scenario]:
    """`n` tasks for an agent on `server`, written by `generator` from the server's tools,
    resources and prompts (options go to `art.generate_scenarios`)."""
    description = await describe_server(server)
    tools = [tool.openai_tool() for tool in await server.list_tools()]
    return await art.generate_scenarios(description, n, generator, tools=tools, **options)


@overload
async def generate_scenarios(
    server: McpServer,
    n: int | None = None,
    generator: art.Model | str | None = None,
    *,
    num_scenarios: int | None = None,
    show_preview: bool | None = None,
    custom_instructions: str | None = None,
    generator_model: str | None = None,
    generator_api_key: str | None = None,
    generator_base_url: str | None = None,
    **options: Any,
) -> list[art.Scenario]: ...
@overload
async def generate_scenarios(
    server: Any = None,
    n: int | None = None,
    generator: art.Model | str | None = None,
    *,
    tools: Any = None,
    resources: Sequence[Any] | None = None,
    num_scenarios: int | None = None,
    show_preview: bool | None = None,
    custom_instructions: str | None = None,
    generator_model: str | None = None,
    generator_api_key: str | None = None,
    generator_base_url: str | None = None,
    **options: Any,
) -> GeneratedScenarioCollection: ...
async def generate_scenarios(
    server: Any = None,
    n: int | None = None,
    generator: art.Model | str | None = None,
    *,
    tools: Any = None,
    resources: Sequence[Any] | None = None,
    num_scenarios: int | None = None,
    show_preview: bool | None = None,
    custom_instructions: str | None = None,
    generator_model: str | None = None,
    generator_api_key: str | None = None,
    generator_base_url: str | None = None,
    **options: Any,
) -> list[art.Scenario] | GeneratedScenarioCollection:
    """Scenarios for an agent on an MCP server: `(server, n, generator)` gives a list of
    `art.Scenario`; ART's `tools=` (and `resources=`) give a `GeneratedScenarioCollection`.

    `n` or ART's `num_scenarios` (default 24); `generator` (an `art.Model` or
    `"<provider>/<model>"`) or ART's `generator_model` / `generator_api_key` /
    `generator_base_url` (default `openai/gpt-4.1-mini`, see the module doc). `show_preview`
    (ART's form: default True) prints the difficulty distribution and the first five tasks.
    `options` go to `art.generate_scenarios` (`cache`, `difficulty`, `sampling`, ...).
    """
    if isinstance(server, McpServer):
        if tools is not None or resources is not None:
            raise McpConfigError(
                "generate_scenarios(server, ...) describes the server's own tools and resources: "
                "pass either a server or ART's tools=/resources=, not both."
            )
    elif server is not None:  # ART's first positional argument: the tools
        if tools is not None:
            raise McpConfigError(
                "generate_scenarios: the tools are given twice (positionally and as tools=)."
            )
        tools, server = server, None
    if n is not None and num_scenarios is not None:
        raise McpConfigError("generate_scenarios: give n or num_scenarios, not both.")
    count = n if n is not None else num_scenarios if num_scenarios is not None else DEFAULT_COUNT
    specs = tool_specs(tools)
    if server is None and not specs and not resources:
        raise McpConfigError(
            "generate_scenarios: give at least one tool or resource (tools=await "
            "server.list_tools(), or an MCP server: generate_scenarios(server, n, generator))."
        )
    model = _generator(generator, generator_model, generator_api_key, generator_base_url)
    if custom_instructions is not None:
        options["custom_instructions"] = custom_instructions
    if server is not None:
        scenarios = await scenarios_for_server(server, count, model, **options)
        if show_preview:
            GeneratedScenarioCollection(scenarios).print_difficulty_distribution()
            print_preview(scenarios, PREVIEWED)
        return scenarios
    description = "\n".join(
        [
            "The agent works with an MCP server, through the tools listed below.",
            *_resource_lines(resources or []),
            "Tasks are requests a user of this server would make that the tools can accomplish.",
        ]
    )
    collection = GeneratedScenarioCollection(
        await art.generate_scenarios(description, count, model, tools=specs or None, **options)
    )
    if show_preview is not False:  # ART's default: shown
        collection.print_difficulty_distribution()
        collection.preview(PREVIEWED)
    return collection


def _generator(
    generator: art.Model | str | None,
    model: str | None,
    api_key: str | None,
    base_url: str | None,
) -> art.Model | str:
    """The generator given as ours (`generator`), or as ART's three keywords."""
    if generator is not None:
        if model or api_key or base_url:
            raise McpConfigError(
                "generate_scenarios: give generator= or ART's generator_model= (with "
                "generator_api_key= and generator_base_url=), not both."
            )
        return generator
    name = model or DEFAULT_GENERATOR
    if base_url:
        return art.Model(name=name, base_url=base_url, api_key=api_key)
    return art.resolve_model(name, api_key=api_key)


def tool_specs(tools: Any) -> list[dict[str, Any]]:
    """ART's `tools` argument as OpenAI function tools (see the module doc for what it takes)."""
    if tools is None:
        return []
    listed = getattr(tools, "tools", tools)  # the MCP SDK's ListToolsResult
    if isinstance(listed, Mapping | str) or not isinstance(listed, Sequence):
        raise McpConfigError(
            f"generate_scenarios: tools is a list of MCP tools (await server.list_tools()), "
            f"got a {type(tools).__name__}."
        )
    return [_tool_spec(tool, index) for index, tool in enumerate(listed)]


def _tool_spec(tool: Any, index: int) -> dict[str, Any]:
    if isinstance(tool, McpTool):
        return tool.openai_tool()
    if isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping):
        return dict(tool)  # already an OpenAI tool

    def field(*names: str) -> Any:
        for name in names:
            value = tool.get(name) if isinstance(tool, Mapping) else getattr(tool, name, None)
            if value is not None:
                return value
        return None

    name = field("name")
    if not isinstance(name, str) or not name:
        raise McpConfigError(
            f"generate_scenarios: tools[{index}] has no name; a tool is an MCP tool (an object "
            "or a dict with name, description and parameters / inputSchema)."
        )
    schema = field("parameters", "input_schema", "inputSchema") or {}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": str(field("description") or ""),
            "parameters": openai_parameters(dict(schema)),
        },
    }


def _resource_lines(resources: Sequence[Any]) -> list[str]:
    """Resources (SDK objects or dicts: uri, name, description) as lines of the description."""
    lines = []
    for resource in list(resources)[:SHOWN_RESOURCES]:
        if isinstance(resource, Mapping):
            uri, name, about = (resource.get(k) for k in ("uri", "name", "description"))
        else:
            uri, name, about = (getattr(resource, k, None) for k in ("uri", "name", "description"))
        lines.append(f"- {uri or name}: {about or name or ''}".rstrip(": "))
    return ["Its resources (data the tasks can be about):", *lines] if lines else []
