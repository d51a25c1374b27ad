"""The errors of art_mcp: an MCP server that cannot serve (not a tool that reports an error,
which is an observation the agent sees), and a setup that cannot work."""

from __future__ import annotations

import art_core as art


class McpServerError(art.ArtError):
    """The MCP server is unreachable, crashed, hung or broke the protocol: the rollout cannot go on.

    A rollout that raises it is kept on its group as an exception; the training run goes on and
    the failure rate is in the step's metrics (`mcp/failed_rollouts`).
    """


class McpConfigError(art.ArtError, ValueError):
    """An option names what the server does not have (e.g. `allowed_tools`, a tool name)."""


class McpContextError(art.ArtError):
    """The agent's first request (system prompt and tool schemas) does not fit the model's
    context with room to answer: offer fewer tools (`allowed_tools`) or use a longer context."""


class McpScenarioFileError(McpConfigError):
    """A scenario file (`art mcp-train --scenarios FILE`) that cannot be used: the message names
    the file, the line and the field, and says what a line must hold."""

    def __init__(
        self, message: str, *, path: str, line: int | None = None, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.field = field


class McpScenarioToolsError(McpConfigError):
    """Scenarios whose checks require calls to tools the agent is not offered (not in
    `allowed_tools` / `--tools`, or not on the server): those checks could never pass.
    `.missing` maps each such tool name to the scenarios (1-based, in order) that call it."""

    def __init__(self, message: str, *, missing: dict[str, list[int]]) -> None:
        super().__init__(message)
        self.missing = missing
