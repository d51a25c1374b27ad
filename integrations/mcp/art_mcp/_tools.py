"""An MCP server's tools as OpenAI function tools: names made valid, reversibly.

OpenAI function names must match `^[a-zA-Z0-9_-]{1,64}$`; MCP tool names may hold dots, slashes,
spaces or be longer. Every other character becomes `_`, a name is cut to 64 characters, and when
two tools end up with one name the later one gets `_2`, `_3`, ... (reported in `collisions`).
The map goes both ways, so a call the model makes reaches the right MCP tool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_NAME = 64
_INVALID = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(frozen=True)
class McpTool:
    """One tool of an MCP server: its MCP name, the name the model sees, and its schema."""

    name: str
    openai_name: str
    description: str
    input_schema: dict[str, Any]

    def openai_tool(self) -> dict[str, Any]:
        """The tool in OpenAI's `tools=[...]` format."""
        return {
            "type": "function",
            "function": {
                "name": self.openai_name,
                "description": self.description,
                "parameters": openai_parameters(self.input_schema),
            },
        }


@dataclass
class ToolNames:
    """The reversible name map of one server's tool list."""

    to_mcp: dict[str, str] = field(default_factory=dict)
    collisions: list[tuple[str, str]] = field(default_factory=list)  # (mcp name, openai name)

    def add(self, mcp_name: str, reserved: set[str] = frozenset()) -> str:  # type: ignore[assignment]
        """The OpenAI name for `mcp_name`, unique among those added and `reserved`."""
        base = _INVALID.sub("_", mcp_name)[:MAX_NAME] or "tool"
        name, counter = base, 1
        while name in self.to_mcp or name in reserved:
            counter += 1
            suffix = f"_{counter}"
            name = base[: MAX_NAME - len(suffix)] + suffix
        if name != base:
            self.collisions.append((mcp_name, name))
        self.to_mcp[name] = mcp_name
        return name


def tools_from_listing(
    listed: list[Any],
    reserved: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[list[McpTool], ToolNames]:
    """`McpTool`s from the SDK's `Tool` objects (of `list_tools()`), with their name map."""
    names = ToolNames()
    tools = [
        McpTool(
            name=tool.name,
            openai_name=names.add(tool.name, reserved),
            description=(tool.description or tool.title or tool.name).strip(),
            input_schema=dict(tool.input_schema or {}),
        )
        for tool in listed
    ]
    return tools, names


def openai_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """An MCP input schema (JSON Schema) as OpenAI function parameters: always an object."""
    parameters = {key: value for key, value in schema.items() if key != "$schema"}
    if parameters.get("type") != "object":
        # A tool without arguments, or a schema that is not an object: the model sends {}.
        return {"type": "object", "properties": {}}
    parameters.setdefault("properties", {})
    return parameters
