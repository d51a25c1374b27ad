"""art_mcp: train an agent against any MCP server, reached by URL, by command or in-process.

    import art_mcp
    server = art_mcp.McpServer.from_url("http://127.0.0.1:8765/mcp")   # or .from_command(...)
    tools = await server.list_tools()
    trajectory = await art_mcp.rollout(model, server, "Which items are low on stock?")
    result = await art_mcp.train(server, model, judge=judge, steps=4)
    result = await art_mcp.train(server, model, scenarios="checks.jsonl", sft="demos.jsonl")

ART's `art.mcp.generate_scenarios(tools=..., num_scenarios=..., generator_model=...)` works too
(from `art_core.mcp`), returning ART's `GeneratedScenarioCollection`.

Command line: `art mcp-train <URL> | --stdio "<command>" --model ... --steps ...`.
"""

from art_core._refused_art_names import module_getattr
from art_mcp._agent import COMPLETE_TASK, rollout
from art_mcp._checked import CheckedScenario, load_scenarios
from art_mcp._collection import GeneratedScenarioCollection
from art_mcp._content import result_text
from art_mcp._context import check_context
from art_mcp._errors import (
    McpConfigError,
    McpContextError,
    McpScenarioFileError,
    McpScenarioToolsError,
    McpServerError,
)
from art_mcp._scenarios import describe_server, generate_scenarios
from art_mcp._server import McpServer, McpSession, ToolOutcome
from art_mcp._tools import McpTool, ToolNames
from art_mcp._train import train

__all__ = [
    "COMPLETE_TASK",
    "CheckedScenario",
    "GeneratedScenarioCollection",
    "McpConfigError",
    "McpContextError",
    "McpScenarioFileError",
    "McpScenarioToolsError",
    "McpServer",
    "McpServerError",
    "McpSession",
    "McpTool",
    "ToolNames",
    "ToolOutcome",
    "check_context",
    "describe_server",
    "generate_scenarios",
    "load_scenarios",
    "result_text",
    "rollout",
    "train",
]

# ART's `art.mcp` name we do not implement (MCPResource) imports
# from here and raise art.UnsupportedOptionError with the reason when used (art_core/_refused_art_names.py).
__getattr__ = module_getattr("art.mcp", __name__)
