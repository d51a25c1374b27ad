"""The example inventory MCP server with every tool call timed inside the server process.

    python benchmarks/_timed_inventory_server.py TIMINGS_FILE [--http --port N]

Each tool call appends one line, its seconds, to TIMINGS_FILE: the time in `MCPServer.call_tool`
(argument validation, the tool on its worker thread, result conversion), i.e. the server's own
work without the JSON-RPC framing and transport. Several processes (one per stdio session) may
append to one file: each line is written by one `os.write` on an O_APPEND descriptor.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.mcp_servers.inventory_server import DEFAULT_HOST, HTTP_PATH, create_server


def timed_server(timings_path: str) -> Any:
    """`create_server()` with its `call_tool` wrapped to log each call's duration."""
    server = create_server()
    untimed = server.call_tool
    descriptor = os.open(timings_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def call_tool(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await untimed(*args, **kwargs)
        finally:
            os.write(descriptor, f"{time.perf_counter() - started:.9f}\n".encode())

    server.call_tool = call_tool  # type: ignore[method-assign]
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timings", help="file to append each tool call's seconds to")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = timed_server(args.timings)
    if args.http:
        server.run(
            "streamable-http", host=DEFAULT_HOST, port=args.port, streamable_http_path=HTTP_PATH
        )
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
