"""An example MCP server: the inventory of a small coffee-and-tea shop, kept in SQLite.

Tools search, read, create and restock items and report low stock; a resource lists the
categories and another reads one item; a prompt asks for a restocking plan. The store is seeded
with 30 items on first start. Built on the mcp 2.x high-level server (`MCPServer`, which was
`FastMCP` in mcp 1.x).

    python examples/mcp_servers/inventory_server.py                  # stdio
    python examples/mcp_servers/inventory_server.py --http           # http://127.0.0.1:8765/mcp
    python examples/mcp_servers/inventory_server.py --db shop.sqlite --http --port 9000

In-process (tests, or an agent trained against it): `create_server()` returns the `MCPServer`.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

SERVER_VERSION = "1.0.0"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
HTTP_PATH = "/mcp"

# (sku, name, category, price in dollars, quantity). Some are deliberately low or out of stock
# so that `low_stock_report` and the restocking prompt have something to find.
SEED_ITEMS: list[tuple[str, str, str, float, int]] = [
    ("COF-001", "Ethiopia Yirgacheffe whole beans 250g", "coffee", 14.50, 24),
    ("COF-002", "Colombia Huila whole beans 250g", "coffee", 12.90, 31),
    ("COF-003", "Brazil Cerrado ground coffee 500g", "coffee", 16.00, 3),
    ("COF-004", "Guatemala Antigua whole beans 1kg", "coffee", 42.00, 7),
    ("COF-005", "House espresso blend 1kg", "coffee", 34.50, 0),
    ("COF-006", "Decaf Swiss Water Peru 250g", "coffee", 13.90, 9),
    ("COF-007", "Kenya AA whole beans 250g", "coffee", 17.50, 2),
    ("COF-008", "Cold brew coarse grind 500g", "coffee", 15.00, 12),
    ("TEA-001", "Darjeeling first flush loose leaf 100g", "tea", 11.00, 18),
    ("TEA-002", "Japanese sencha loose leaf 100g", "tea", 9.50, 4),
    ("TEA-003", "Earl Grey tea bags (20)", "tea", 5.90, 40),
    ("TEA-004", "Ceremonial matcha 30g", "tea", 22.00, 6),
    ("TEA-005", "Rooibos vanilla loose leaf 100g", "tea", 7.80, 1),
    ("TEA-006", "Chamomile flowers 50g", "tea", 6.50, 15),
    ("TEA-007", "Oolong Tie Guan Yin 100g", "tea", 13.20, 8),
    ("BRW-001", "Pour-over dripper, ceramic, size 02", "brewing", 24.00, 10),
    ("BRW-002", "Paper filters size 02 (100)", "brewing", 6.00, 55),
    ("BRW-003", "French press 1L, stainless steel", "brewing", 39.00, 5),
    ("BRW-004", "Hand grinder with conical burrs", "brewing", 65.00, 3),
    ("BRW-005", "Gooseneck kettle 0.9L", "brewing", 49.00, 6),
    ("BRW-006", "Digital scale with timer", "brewing", 29.00, 0),
    ("BRW-007", "Moka pot, 6 cups", "brewing", 32.00, 11),
    ("BRW-008", "Cold brew bottle 1L", "brewing", 27.50, 14),
    ("ACC-001", "Stoneware mug 350ml, speckled white", "accessories", 16.00, 22),
    ("ACC-002", "Double-wall glass cup 250ml (pair)", "accessories", 19.00, 4),
    ("ACC-003", "Insulated travel tumbler 470ml", "accessories", 28.00, 13),
    ("ACC-004", "Bamboo tea tray", "accessories", 35.00, 2),
    ("ACC-005", "Milk frother, handheld", "accessories", 18.50, 9),
    ("ACC-006", "Airtight coffee canister 500g", "accessories", 21.00, 16),
    ("ACC-007", "Gift card 25 USD", "accessories", 25.00, 100),
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    sku TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price REAL NOT NULL CHECK (price >= 0),
    quantity INTEGER NOT NULL CHECK (quantity >= 0)
)
"""


class Item(BaseModel):
    """One stock-keeping unit on the shelf."""

    sku: str
    name: str
    category: str
    price: float
    quantity: int


class SearchResult(BaseModel):
    """The items a search found (at most `max_results`) and how many matched in all."""

    items: list[Item]
    total_matches: int


class StockUpdate(BaseModel):
    """The quantity of an item before and after a stock change."""

    sku: str
    previous_quantity: int
    quantity: int


class LowStockReport(BaseModel):
    """Items at or below the threshold, emptiest first."""

    threshold: int
    items: list[Item]


class InventoryStore:
    """The shop's items in one SQLite database, safe to call from several threads at once.

    `MCPServer` runs synchronous tools on worker threads and an HTTP server serves several
    sessions at once, so one connection is shared behind a lock (":memory:" databases exist only
    inside the connection that created them, so a connection per call would not do).
    """

    def __init__(self, db_path: str = ":memory:") -> None:
        self._connection = sqlite3.connect(db_path, check_same_thread=False)
        self._connection.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._transaction() as cursor:
            cursor.execute(SCHEMA)
            if cursor.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0:
                cursor.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?)", SEED_ITEMS)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        with self._lock, self._connection:
            yield self._connection.cursor()

    def search(self, query: str, category: str | None, max_results: int) -> SearchResult:
        """Items whose name or SKU contains `query` (any case), optionally in one category."""
        # Escaped so that a '%' or '_' in the query is matched literally, not as a wildcard.
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where = "(name LIKE ? ESCAPE '\\' OR sku LIKE ? ESCAPE '\\')"
        parameters: list[object] = [pattern, pattern]
        if category is not None:
            where += " AND category = ? COLLATE NOCASE"
            parameters.append(category)
        with self._transaction() as cursor:
            total = cursor.execute(f"SELECT COUNT(*) FROM items WHERE {where}", parameters)
            total_matches = total.fetchone()[0]
            rows = cursor.execute(
                f"SELECT * FROM items WHERE {where} ORDER BY sku LIMIT ?",
                [*parameters, max_results],
            ).fetchall()
        return SearchResult(items=[Item(**row) for row in rows], total_matches=total_matches)

    def get(self, sku: str) -> Item | None:
        """The item with this SKU (any case), or None."""
        with self._transaction() as cursor:
            row = cursor.execute(
                "SELECT * FROM items WHERE sku = ? COLLATE NOCASE", (sku,)
            ).fetchone()
        return None if row is None else Item(**row)

    def create(self, item: Item) -> None:
        """Add a new item; raises ToolError if the SKU is taken."""
        try:
            with self._transaction() as cursor:
                cursor.execute(
                    "INSERT INTO items VALUES (?, ?, ?, ?, ?)",
                    (item.sku, item.name, item.category, item.price, item.quantity),
                )
        except sqlite3.IntegrityError as error:
            raise ToolError(
                f"An item with SKU {item.sku!r} already exists: use update_stock to change its "
                "quantity, or pick another SKU."
            ) from error

    def change_stock(self, sku: str, delta: int) -> StockUpdate:
        """Add `delta` (negative to remove) to an item's quantity, never going below zero."""
        with self._transaction() as cursor:
            row = cursor.execute(
                "SELECT sku, quantity FROM items WHERE sku = ? COLLATE NOCASE", (sku,)
            ).fetchone()
            if row is None:
                raise ToolError(unknown_sku_message(sku))
            previous = row["quantity"]
            if previous + delta < 0:
                raise ToolError(
                    f"Cannot remove {-delta} units of {row['sku']}: only {previous} in stock. "
                    "Stock cannot go below zero."
                )
            cursor.execute(
                "UPDATE items SET quantity = ? WHERE sku = ?", (previous + delta, row["sku"])
            )
        return StockUpdate(sku=row["sku"], previous_quantity=previous, quantity=previous + delta)

    def low_stock(self, threshold: int) -> list[Item]:
        """Items with at most `threshold` units, emptiest first."""
        with self._transaction() as cursor:
            rows = cursor.execute(
                "SELECT * FROM items WHERE quantity <= ? ORDER BY quantity, sku", (threshold,)
            ).fetchall()
        return [Item(**row) for row in rows]

    def categories(self) -> list[dict[str, object]]:
        """Each category with its number of items and of units in stock."""
        with self._transaction() as cursor:
            rows = cursor.execute(
                "SELECT category, COUNT(*) AS items, SUM(quantity) AS units_in_stock "
                "FROM items GROUP BY category ORDER BY category"
            ).fetchall()
        return [dict(row) for row in rows]


def unknown_sku_message(sku: str) -> str:
    return f"No item with SKU {sku!r}. Use search_items to find the SKU of an item."


def create_server(db_path: str = ":memory:") -> MCPServer:
    """The inventory MCP server over the SQLite database at `db_path` (seeded when empty)."""
    store = InventoryStore(db_path)
    server = MCPServer(
        "inventory",
        version=SERVER_VERSION,
        instructions=(
            "The inventory of a small coffee-and-tea shop. Find items with search_items, read one "
            "with get_item, record deliveries and sales with update_stock, and check what needs "
            "reordering with low_stock_report."
        ),
        # The tool list never changes, so there is nothing to subscribe to.
        subscriptions=False,
    )
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=read_only)
    def search_items(
        query: Annotated[
            str,
            Field(description="Text to find in the item name or SKU, any case; '' matches all."),
        ],
        category: Annotated[
            str | None,
            Field(description="Only items in this category (see inventory://categories)."),
        ] = None,
        max_results: Annotated[
            int, Field(ge=1, le=50, description="Return at most this many items.")
        ] = 10,
    ) -> SearchResult:
        """Search the inventory by name or SKU; returns the matching items and the total count."""
        return store.search(query, category, max_results)

    @server.tool(annotations=read_only)
    def get_item(
        sku: Annotated[str, Field(description="The item's SKU, e.g. 'COF-001'.")],
    ) -> Item:
        """Get one item by SKU: name, category, price in dollars and quantity in stock."""
        item = store.get(sku)
        if item is None:
            raise ToolError(unknown_sku_message(sku))
        return item

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False))
    def create_item(
        sku: Annotated[
            str,
            Field(min_length=1, max_length=32, description="A new, unique SKU, e.g. 'TEA-008'."),
        ],
        name: Annotated[str, Field(min_length=1, description="The product name.")],
        category: Annotated[
            str, Field(min_length=1, description="The category, e.g. 'coffee' or 'tea'.")
        ],
        price: Annotated[float, Field(ge=0, description="The unit price in dollars.")],
        quantity: Annotated[int, Field(ge=0, description="Units in stock to start with.")],
    ) -> Item:
        """Add a new item to the inventory; fails if the SKU already exists."""
        item = Item(sku=sku, name=name, category=category, price=price, quantity=quantity)
        store.create(item)
        return item

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False))
    def update_stock(
        sku: Annotated[str, Field(description="The item's SKU, e.g. 'COF-001'.")],
        delta: Annotated[
            int,
            Field(description="Units to add (a delivery, positive) or remove (a sale, negative)."),
        ],
    ) -> StockUpdate:
        """Change an item's quantity in stock by `delta`; refuses to go below zero."""
        return store.change_stock(sku, delta)

    @server.tool(annotations=read_only)
    def low_stock_report(
        threshold: Annotated[
            int, Field(ge=0, description="Report items with at most this many units.")
        ] = 5,
    ) -> LowStockReport:
        """List the items with at most `threshold` units in stock, emptiest first."""
        return LowStockReport(threshold=threshold, items=store.low_stock(threshold))

    @server.resource(
        "inventory://categories",
        name="categories",
        description="The item categories with their number of items and units in stock.",
        mime_type="application/json",
    )
    def categories() -> str:
        return json.dumps(store.categories(), indent=2)

    @server.resource(
        "inventory://items/{sku}",
        name="item",
        description="One item by SKU, as JSON.",
        mime_type="application/json",
    )
    def item_resource(sku: str) -> str:
        item = store.get(sku)
        if item is None:
            raise ResourceNotFoundError(unknown_sku_message(sku))
        return item.model_dump_json(indent=2)

    @server.prompt()
    def restocking_plan(
        budget: Annotated[float, Field(description="The money available, in dollars.")] = 500.0,
        threshold: Annotated[int, Field(description="Restock items at or below this.")] = 5,
    ) -> str:
        """Ask for a restocking plan for the low-stock items, within a budget."""
        low = store.low_stock(threshold)
        lines = "\n".join(
            f"- {item.sku} {item.name} ({item.category}): {item.quantity} left, "
            f"${item.price:.2f} each"
            for item in low
        )
        return (
            f"You manage the shop's inventory. These items have {threshold} units or fewer:\n"
            f"{lines or '- none'}\n\n"
            f"Plan a restock within ${budget:.2f} (assume we pay half the shelf price per unit). "
            "Prioritise items that are out of stock. For each item give the SKU and the units to "
            "order, then record each delivery with update_stock and finish with "
            "low_stock_report to confirm."
        )

    return server


def main(argv: list[str] | None = None) -> None:
    """Run the server over stdio, or over streamable HTTP with --http."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=":memory:", help="SQLite file (default: in memory)")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    server = create_server(args.db)
    if args.http:
        server.run(
            "streamable-http", host=args.host, port=args.port, streamable_http_path=HTTP_PATH
        )
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
