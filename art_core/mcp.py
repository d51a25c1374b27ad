"""ART's `art.mcp`: the MCP integration, `art_mcp` (the [mcp] extra), with ART's names.

`from art_core.mcp import MCPTool, generate_scenarios` ports ART's line: `MCPTool` is
`art_mcp.McpTool`, `complete_task_tool` is `art_mcp.COMPLETE_TASK` (a tool dict),
`GeneratedScenario` is `art_core.Scenario`, and `generate_scenarios(tools=..., num_scenarios=...,
generator_model=...)` returns ART's `GeneratedScenarioCollection`; ART's names art_mcp refuses
import and say why.
Imported on first use (a missing extra raises ImportError naming it).
"""

from art_core._refused_art_names import integration_getattr

__all__: list[str] = []  # art_mcp's names: `art_mcp.__all__`

__getattr__ = integration_getattr(
    __name__,
    "art_mcp",
    "mcp",
    {
        "MCPTool": "art_mcp:McpTool",
        "complete_task_tool": "art_mcp:COMPLETE_TASK",
        "GeneratedScenario": "art_core.rewards:Scenario",
    },
)
