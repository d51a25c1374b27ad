"""A toy MCP server for the edge cases of art_mcp: a tool that hangs, one that returns a huge
result, one that kills the server, an image, and two tools whose names collide once made valid
for OpenAI. In-process (`toy_server()`), over stdio (`python tests/mcp/toy_server.py`) or over
streamable HTTP (`--http PORT`).

Options for the failures a real server shows: `--crash-after N` exits after answering N tool
calls (the N+1th kills it), `--silent` answers the initialize handshake and then nothing ever
again (a hung server; stdio only), `--prompt-chars N` adds a prompt with an N-character
description (a long server description, for a scenario generator's context).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\0" * 92
HTTP_PATH = "/mcp"


def toy_server(crash_after: int | None = None, prompt_chars: int = 0) -> MCPServer:
    server = MCPServer("toy")
    calls = 0

    def count_call() -> None:
        nonlocal calls
        calls += 1
        if crash_after is not None and calls > crash_after:
            os._exit(3)

    @server.tool(name="notes.search", description="Search the notes (dotted name).")
    def notes_dot(query: str) -> str:
        count_call()
        return f"dot:{query}"

    @server.tool(name="notes/search", description="Search the notes (slashed name).")
    def notes_slash(query: str) -> str:
        count_call()
        return f"slash:{query}"

    @server.tool(description="Never answers.")
    async def hang() -> str:
        await asyncio.sleep(3600)
        return "late"

    @server.tool(description="Returns a very long text.")
    def huge(size: int = 100_000) -> str:
        count_call()
        return "x" * (size - 3) + "END"

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

    if prompt_chars:
        words = "Summarise the notes on one topic, with their dates and their authors. "

        @server.prompt(description=(words * (prompt_chars // len(words) + 1))[:prompt_chars])
        def summary() -> str:
            return "Summarise the notes."

    return server


def serve_silently() -> None:
    """Answer `initialize` like a real server, then read and ignore everything (stdio)."""
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("method") == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "silent", "version": "1"},
            }
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    parser.add_argument("--crash-after", type=int, help="exit after answering N tool calls")
    parser.add_argument("--silent", action="store_true", help="go silent after the handshake")
    parser.add_argument("--prompt-chars", type=int, default=0, help="a long prompt description")
    args = parser.parse_args()
    if args.silent:
        serve_silently()
    elif args.http:
        toy_server(args.crash_after, args.prompt_chars).run(
            "streamable-http", host="127.0.0.1", port=args.http, streamable_http_path=HTTP_PATH
        )
    else:
        toy_server(args.crash_after, args.prompt_chars).run("stdio")
