"""The example inventory server speaks MCP over every transport an agent would use (in memory,
streamable HTTP, stdio) with the raw mcp client, and the published mcp-server-time over stdio."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client import Client, Transport
from mcp.client._memory import InMemoryTransport
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, TextResourceContents

from examples.mcp_servers.inventory_server import create_server

TOOL_NAMES = {"search_items", "get_item", "create_item", "update_stock", "low_stock_report"}

OpenTransport = Callable[[], Transport]


@pytest.fixture(params=["in-memory", "http", "stdio"])
def open_transport(request: pytest.FixtureRequest, inventory_server: MCPServer) -> OpenTransport:
    """Opens a fresh transport to the inventory server, once per transport kind."""
    if request.param == "in-memory":
        return lambda: InMemoryTransport(inventory_server)
    if request.param == "http":
        url = request.getfixturevalue("inventory_http_url")
        return lambda: streamable_http_client(url)
    command, args = request.getfixturevalue("inventory_stdio_command")
    return lambda: stdio_client(StdioServerParameters(command=command, args=args))


@asynccontextmanager
async def session_over(transport: Transport) -> AsyncIterator[ClientSession]:
    """A ClientSession over `transport`, after the initialize handshake."""
    async with transport as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], TextContent)
    return result.content[0].text


def unique_sku() -> str:
    return f"TST-{uuid.uuid4().hex[:8].upper()}"


async def create_test_item(session: ClientSession, quantity: int) -> str:
    sku = unique_sku()
    arguments = {"sku": sku, "name": "Test", "category": "test", "price": 1.0, "quantity": quantity}
    result = await session.call_tool("create_item", arguments)
    assert not result.is_error, text_of(result)
    return sku


async def test_lists_tools_with_typed_schemas_resources_and_prompts(open_transport: OpenTransport):
    async with session_over(open_transport()) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        resources = (await session.list_resources()).resources
        templates = (await session.list_resource_templates()).resource_templates
        prompts = (await session.list_prompts()).prompts

    assert set(tools) == TOOL_NAMES
    assert all(tool.description for tool in tools.values())
    search_schema = tools["search_items"].input_schema
    assert search_schema["required"] == ["query"]
    assert search_schema["properties"]["max_results"]["type"] == "integer"
    assert search_schema["properties"]["max_results"]["default"] == 10
    assert search_schema["properties"]["query"]["description"]
    create_schema = tools["create_item"].input_schema
    assert set(create_schema["required"]) == {"sku", "name", "category", "price", "quantity"}
    assert create_schema["properties"]["price"]["type"] == "number"
    assert tools["update_stock"].input_schema["properties"]["delta"]["type"] == "integer"
    assert tools["get_item"].output_schema is not None
    assert [str(resource.uri) for resource in resources] == ["inventory://categories"]
    assert [template.uri_template for template in templates] == ["inventory://items/{sku}"]
    assert [prompt.name for prompt in prompts] == ["restocking_plan"]
    assert {argument.name for argument in prompts[0].arguments or []} == {"budget", "threshold"}


async def test_each_tool_answers(open_transport: OpenTransport):
    async with session_over(open_transport()) as session:
        search = await session.call_tool("search_items", {"query": "sencha"})
        in_category = await session.call_tool(
            "search_items", {"query": "", "category": "Tea", "max_results": 3}
        )
        item = await session.call_tool("get_item", {"sku": "cof-001"})
        sku = await create_test_item(session, quantity=2)
        delivered = await session.call_tool("update_stock", {"sku": sku, "delta": 5})
        sold = await session.call_tool("update_stock", {"sku": sku, "delta": -7})
        report = await session.call_tool("low_stock_report", {"threshold": 0})

    assert not any(r.is_error for r in (search, in_category, item, delivered, sold, report))
    assert search.structured_content == {
        "items": [
            {
                "sku": "TEA-002",
                "name": "Japanese sencha loose leaf 100g",
                "category": "tea",
                "price": 9.5,
                "quantity": 4,
            }
        ],
        "total_matches": 1,
    }
    assert json.loads(text_of(search)) == search.structured_content
    assert len(in_category.structured_content["items"]) == 3
    assert in_category.structured_content["total_matches"] == 7
    assert item.structured_content["sku"] == "COF-001"
    assert delivered.structured_content == {"sku": sku, "previous_quantity": 2, "quantity": 7}
    assert sold.structured_content == {"sku": sku, "previous_quantity": 7, "quantity": 0}
    assert sku in {entry["sku"] for entry in report.structured_content["items"]}


async def test_stock_below_zero_is_a_tool_error_with_the_reason(inventory_server: MCPServer):
    async with session_over(InMemoryTransport(inventory_server)) as session:
        refused = await session.call_tool("update_stock", {"sku": "COF-003", "delta": -10})
        after = await session.call_tool("get_item", {"sku": "COF-003"})

    assert refused.is_error
    assert "Cannot remove 10 units of COF-003: only 3 in stock" in text_of(refused)
    assert after.structured_content["quantity"] == 3


async def test_stock_below_zero_is_a_tool_error_over_http(inventory_http_url: str):
    async with session_over(streamable_http_client(inventory_http_url)) as session:
        sku = await create_test_item(session, quantity=2)
        refused = await session.call_tool("update_stock", {"sku": sku, "delta": -3})

    assert refused.is_error
    assert f"Cannot remove 3 units of {sku}: only 2 in stock" in text_of(refused)


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("get_item", {"sku": "NOPE-1"}, "No item with SKU 'NOPE-1'"),
        ("update_stock", {"sku": "NOPE-1", "delta": 1}, "No item with SKU 'NOPE-1'"),
        (
            "create_item",
            {"sku": "COF-001", "name": "x", "category": "coffee", "price": 1, "quantity": 1},
            "already exists",
        ),
        ("search_items", {"query": "tea", "max_results": 0}, "max_results"),
        (
            "create_item",
            {"sku": "NEW-1", "name": "x", "category": "tea", "price": -1, "quantity": 1},
            "price",
        ),
    ],
)
async def test_mistakes_are_tool_errors_the_model_can_read(
    inventory_server: MCPServer, tool: str, arguments: dict[str, Any], message: str
):
    async with session_over(InMemoryTransport(inventory_server)) as session:
        result = await session.call_tool(tool, arguments)

    assert result.is_error
    assert message in text_of(result)


async def test_reads_the_categories_and_an_item_resource(inventory_server: MCPServer):
    async with session_over(InMemoryTransport(inventory_server)) as session:
        categories = await session.read_resource("inventory://categories")
        item = await session.read_resource("inventory://items/BRW-004")

    assert isinstance(categories.contents[0], TextResourceContents)
    listed = json.loads(categories.contents[0].text)
    assert [entry["category"] for entry in listed] == ["accessories", "brewing", "coffee", "tea"]
    assert sum(entry["items"] for entry in listed) == 30
    assert isinstance(item.contents[0], TextResourceContents)
    assert json.loads(item.contents[0].text)["name"] == "Hand grinder with conical burrs"


async def test_restocking_prompt_lists_the_low_stock_items(inventory_server: MCPServer):
    async with session_over(InMemoryTransport(inventory_server)) as session:
        prompt = await session.get_prompt("restocking_plan", {"budget": "120", "threshold": "1"})

    assert len(prompt.messages) == 1 and prompt.messages[0].role == "user"
    assert isinstance(prompt.messages[0].content, TextContent)
    text = prompt.messages[0].content.text
    assert "$120.00" in text
    assert "COF-005" in text and "TEA-005" in text and "COF-007" not in text


async def test_concurrent_http_sessions_share_one_store(inventory_http_url: str):
    async with session_over(streamable_http_client(inventory_http_url)) as session:
        sku = await create_test_item(session, quantity=0)
    sessions, deliveries_per_session = 6, 5

    async def deliver() -> None:
        async with session_over(streamable_http_client(inventory_http_url)) as session:
            for _ in range(deliveries_per_session):
                result = await session.call_tool("update_stock", {"sku": sku, "delta": 1})
                assert not result.is_error, text_of(result)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for _ in range(sessions):
                group.start_soon(deliver)

    async with session_over(streamable_http_client(inventory_http_url)) as session:
        item = await session.call_tool("get_item", {"sku": sku})
    assert item.structured_content["quantity"] == sessions * deliveries_per_session


async def test_the_client_negotiates_the_2026_protocol_over_http(inventory_http_url: str):
    async with Client(inventory_http_url) as client:
        result = await client.call_tool("get_item", {"sku": "TEA-004"})

        assert client.protocol_version == "2026-07-28"
    assert result.structured_content["name"] == "Ceremonial matcha 30g"


async def test_a_database_file_keeps_its_items_across_servers(tmp_path: Path):
    database = str(tmp_path / "shop.sqlite")
    async with session_over(InMemoryTransport(create_server(database))) as session:
        await session.call_tool("update_stock", {"sku": "ACC-001", "delta": 3})

    async with session_over(InMemoryTransport(create_server(database))) as session:
        item = await session.call_tool("get_item", {"sku": "ACC-001"})
        everything = await session.call_tool("search_items", {"query": "", "max_results": 50})

    assert item.structured_content["quantity"] == 25
    assert everything.structured_content["total_matches"] == 30


async def test_the_published_time_server_over_stdio(time_server_command: tuple[str, list[str]]):
    command, args = time_server_command
    server = StdioServerParameters(command=command, args=args)
    async with session_over(stdio_client(server)) as session:
        tools = (await session.list_tools()).tools
        result = await session.call_tool("get_current_time", {"timezone": "Europe/Paris"})

    assert {tool.name for tool in tools} == {"get_current_time", "convert_time"}
    assert not result.is_error, text_of(result)
    assert result.structured_content["timezone"] == "Europe/Paris"
    assert result.structured_content["datetime"][:2] == "20"
