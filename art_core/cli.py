"""The `art` command: one entry point whose subcommands live with the package they belong to.

    art mcp-train <URL> | --stdio "<command>" --model ... --steps ...   (art_mcp, extra [mcp])
    art review --path .art [--port 8080] [--api-key KEY]             (art_backend, extra [backend])

The table names modules, not imports: art_core itself never imports MCP or the backend, and a
subcommand whose extra is not installed says which one to install.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "mcp-train": ("art_mcp.cli", "mcp", "train an agent against an MCP server"),
    "review": ("art_backend._review_cli", "backend", "browse trajectories, flag what not to train"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch `art <subcommand> ...`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        lines = [f"  {name:<12} {about}" for name, (_, _, about) in SUBCOMMANDS.items()]
        print("usage: art <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module_name, extra, _ = SUBCOMMANDS[argv[0]]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        print(
            f"art {argv[0]} needs the [{extra}] extra: pip install 'art-trainer[{extra}]' "
            f"({error})",
            file=sys.stderr,
        )
        return 2
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
