"""art_mcp: MCP adapter (not yet built, see issue 6)."""
