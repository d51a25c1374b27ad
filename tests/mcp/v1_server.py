"""A server built on the mcp 1.x SDK (FastMCP), run by the interpreter of `.venv/mcp1` (which
`make test` builds with `mcp<2`): the protocol, not the SDK version, is the contract."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("v1-notes")
NOTES = {"groceries": "milk, eggs, coffee", "ideas": "train an agent on MCP"}


@server.tool()
def read_note(title: str) -> str:
    """Read one note by its title."""
    if title not in NOTES:
        raise ValueError(f"no note titled {title!r}; titles: {sorted(NOTES)}")
    return NOTES[title]


@server.tool()
def list_notes() -> list[str]:
    """The titles of all notes."""
    return sorted(NOTES)


if __name__ == "__main__":
    server.run("stdio")
