"""A toy MCP server for the edge cases of art_mcp: a tool that hangs, one that returns a huge
result, one that kills the server, an image, and two tools whose names collide once made valid
for OpenAI. In-process (`toy_server()`) or over stdio (`python tests/mcp/toy_server.py`)."""

from __future__ import annotations

import asyncio
import base64
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\0" * 92


def toy_server() -> MCPServer:
    server = MCPServer("toy")

    @server.tool(name="notes.search", description="Search the notes (dotted name).")
    def notes_dot(query: str) -> str:
        return f"dot:{query}"

    @server.tool(name="notes/search", description="Search the notes (slashed name).")
    def notes_slash(query: str) -> str:
        return f"slash:{query}"

    @server.tool(description="Never answers.")
    async def hang() -> str:
        await asyncio.sleep(3600)
        return "late"

    @server.tool(description="Returns a very long text.")
    def huge(size: int = 100_000) -> str:
        return "x" * size

    @server.tool(description="Always fails.")
    def broken() -> str:
        raise ToolError("the notes database is locked")

    @server.tool(description="Returns a picture and a caption.")
    def picture() -> list[ImageContent | TextContent]:
        data = base64.b64encode(PNG_BYTES).decode()
        return [
            ImageContent(type="image", data=data, mime_type="image/png"),
            TextContent(type="text", text="a tiny picture"),
        ]

    @server.tool(description="Stops the server process at once (a crash).")
    def crash() -> str:
        os._exit(3)

    return server


if __name__ == "__main__":
    toy_server().run("stdio")
