"""The `art` command: one entry point whose subcommands live with the package they belong to.

    art mcp-train <URL> | --stdio "<command>" --model ... --steps ...   (art_mcp, extra [mcp])
    art review --path .art [--port 8080] [--api-key KEY]             (art_backend, extra [backend])
    art preflight FILE.py:rollout --scenarios S.jsonl --base-url URL --model NAME   (art_core)

Each subcommand is a declared entry point of the group `art_trainer.commands` (pyproject.toml),
so art_core itself never imports MCP or the backend; a subcommand whose extra is not installed
says which one to install. `art preflight` needs nothing more than art_core: it is dispatched
here directly (`art_core.rewards._preflight_cli.preflight_command`).
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "art_trainer.commands"
# subcommand -> (the extra it needs, what it does)
SUBCOMMANDS = {
    "mcp-train": ("mcp", "train an agent against an MCP server"),
    "review": ("backend", "browse trajectories, flag what not to train"),
    "diff": ("backend", "compare two steps' held-out answers"),
    "replay": ("backend", "re-train a step from its saved inputs and check the adapter hash"),
    "preflight": ("", "will this learn? a few groups without training, and a verdict"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch `art <subcommand> ...`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        lines = [f"  {name:<12} {about}" for name, (_, about) in SUBCOMMANDS.items()]
        print("usage: art <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if argv[0] == "preflight":  # art_core's own command: no entry point, no extra
        from art_core.rewards._preflight_cli import preflight_command

        return preflight_command(argv[1:])
    extra, _ = SUBCOMMANDS[argv[0]]
    declared = {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}
    if argv[0] not in declared:
        print(
            f"art {argv[0]}: the entry point is not installed; reinstall art-trainer "
            f"(pip install -e '.[{extra}]').",
            file=sys.stderr,
        )
        return 2
    try:
        command = declared[argv[0]].load()
    except ImportError as error:
        print(
            f"art {argv[0]} needs the [{extra}] extra: pip install 'art-trainer[{extra}]' "
            f"({error})",
            file=sys.stderr,
        )
        return 2
    return int(command(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
