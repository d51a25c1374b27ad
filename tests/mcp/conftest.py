"""MCP servers to test against: the example inventory server (in process, over streamable HTTP
in a subprocess, over stdio) and the published mcp-server-time (over stdio)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.server.mcpserver import MCPServer

from examples.mcp_servers.inventory_server import HTTP_PATH, create_server
from tests.support.models import fresh_model
from tests.support.processes import http_server_process
from tests.support.servers import free_port

INVENTORY_SERVER_PATH = (
    Path(__file__).resolve().parents[2] / "examples" / "mcp_servers" / "inventory_server.py"
)
TOY_SERVER_PATH = Path(__file__).with_name("toy_server.py")


@pytest.fixture
def inventory_server() -> MCPServer:
    """A fresh in-process inventory server with its own seeded in-memory store."""
    return create_server()


@pytest.fixture(scope="session")
def inventory_http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The inventory server's CLI with --http in a subprocess, shared by the session: its URL.

    Its store is shared too: a test that changes it creates its own items (unique SKUs).
    """
    port = free_port()
    command = [sys.executable, str(INVENTORY_SERVER_PATH), "--http", "--port", str(port)]
    with http_server_process(command, port, tmp_path_factory.mktemp("inventory-http")):
        yield f"http://127.0.0.1:{port}{HTTP_PATH}"


@pytest.fixture(scope="session")
def toy_http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The toy server (tests/mcp/toy_server.py) over streamable HTTP in a subprocess: its URL."""
    port = free_port()
    command = [sys.executable, str(TOY_SERVER_PATH), "--http", str(port)]
    with http_server_process(command, port, tmp_path_factory.mktemp("toy-http")):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def inventory_stdio_command() -> tuple[str, list[str]]:
    """(command, args) that start the inventory server over stdio, each start a fresh store."""
    return sys.executable, [str(INVENTORY_SERVER_PATH)]


@pytest.fixture
def time_server_command() -> tuple[str, list[str]]:
    """(command, args) that start the published mcp-server-time over stdio."""
    return sys.executable, ["-m", "mcp_server_time"]


# ------------------------------------------------ policies: scripted (real HTTP) and the tiny model


@pytest.fixture
def policy(scripted_judge):  # type: ignore[no-untyped-def]
    """A scripted OpenAI-compatible policy on 127.0.0.1: queue its turns with `.queue(...)`."""
    import art_core as art

    return scripted_judge, art.Model(name="policy", base_url=scripted_judge.url, api_key="x")


@pytest.fixture
async def tiny_model(remote_backend, tiny_model_dir):  # type: ignore[no-untyped-def]
    """A fresh trainable model on the tiny random base model, served by the test backend."""
    return await fresh_model(remote_backend, tiny_model_dir)
