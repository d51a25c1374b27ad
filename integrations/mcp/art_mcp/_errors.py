"""The errors of art_mcp: an MCP server that cannot serve (not a tool that reports an error,
which is an observation the agent sees)."""

from __future__ import annotations

import art_core as art


class McpServerError(art.ArtError):
    """The MCP server is unreachable, crashed, or broke the protocol: the rollout cannot go on.

    A rollout that raises it is kept on its group as an exception; the training run goes on and
    the failure rate is in the step's metrics (`mcp/failed_rollouts`).
    """
