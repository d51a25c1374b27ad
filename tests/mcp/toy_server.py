"""A toy MCP server for the edge cases of art_mcp: a tool that hangs, one that returns a huge
result, one that kills the server, an image, and two tools whose names collide once made valid
for OpenAI. In-process (`toy_server()`), over stdio (`python tests/mcp/toy_server.py`) or over
streamable HTTP (`--http PORT`).

Options for the failures a real server shows: `--crash-after N` exits after answering N tool
calls (the N+1th kills it), `--prompt-chars N` adds a prompt with an N-character description (a
long server description, for a scenario generator's context). Over stdio only, a server written
by hand (`serve_by_hand`) for what the SDK's servers never do: `--silent` answers the initialize
handshake and then nothing ever again (a hung server), `--mute` answers nothing at all, not even
the handshake, and `--bad-listing error|malformed|exit` answers `tools/list` with a JSON-RPC
error, with a result that is not a tool listing, or with a first page and then a crash.
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


def serve_by_hand(*, handshake: bool = True, listing: str | None = None) -> None:
    """Over stdio: answer `initialize` like a real server (unless `handshake` is False), answer
    `tools/list` as `listing` says (nothing when None), and read and ignore everything else."""
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if method == "initialize" and handshake:
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "by-hand", "version": "1"},
            }
            answer({"jsonrpc": "2.0", "id": message["id"], "result": result})
        elif method == "tools/list" and listing is not None:
            answer_listing(listing, message["id"], (message.get("params") or {}).get("cursor"))


def answer_listing(listing: str, request_id: int, cursor: str | None) -> None:
    if listing == "error":
        error = {"code": -32603, "message": "the tool registry is corrupt"}
        answer({"jsonrpc": "2.0", "id": request_id, "error": error})
    elif listing == "malformed":  # a tool without a name or a schema, its description a number
        answer({"jsonrpc": "2.0", "id": request_id, "result": {"tools": [{"description": 3}]}})
    elif listing == "exit" and cursor is None:
        page = {"tools": [{"name": "first", "inputSchema": {"type": "object"}}], "nextCursor": "2"}
        answer({"jsonrpc": "2.0", "id": request_id, "result": page})
    elif listing == "exit":  # half of the second page, then gone
        sys.stdout.write(f'{{"jsonrpc": "2.0", "id": {request_id}, "result": {{"tools": [{{"na')
        sys.stdout.flush()
        print("listing the tools: out of memory", file=sys.stderr, flush=True)
        os._exit(3)


def answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    parser.add_argument("--crash-after", type=int, help="exit after answering N tool calls")
    parser.add_argument("--silent", action="store_true", help="go silent after the handshake")
    parser.add_argument("--mute", action="store_true", help="answer nothing, not the handshake")
    parser.add_argument("--bad-listing", choices=["error", "malformed", "exit"])
    parser.add_argument("--prompt-chars", type=int, default=0, help="a long prompt description")
    args = parser.parse_args()
    if args.silent or args.mute or args.bad_listing:
        serve_by_hand(handshake=not args.mute, listing=args.bad_listing)
    elif args.http:
        toy_server(args.crash_after, args.prompt_chars).run(
            "streamable-http", host="127.0.0.1", port=args.http, streamable_http_path=HTTP_PATH
        )
    else:
        toy_server(args.crash_after, args.prompt_chars).run("stdio")
