"""docs/layout.md's map of the library, made from the tree: every package and module with the
first sentence of its docstring. `make layout-doc` writes it; tests/test_layout_doc.py fails
when the page and the tree disagree.

    python -m tests.support.layout_doc [--check]
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

from tests.support.python_source import parse_file

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "layout.md"
# The source roots, in the order a reader meets them (the client, the server, the integrations).
PACKAGES = [
    "art_core",
    "backend/art_backend",
    "integrations/langgraph/art_langgraph",
    "integrations/mcp/art_mcp",
    "integrations/ray/art_ray",
]
BEGIN = "<!-- layout:begin: made by `make layout-doc` from each module's docstring; edit those -->"
END = "<!-- layout:end -->"
NAME_COLUMN = 28
WIDTH = 100


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring (its first paragraph, if no sentence ends)."""
    docstring = ast.get_docstring(parse_file(path)) or ""
    paragraph = " ".join(docstring.strip().split("\n\n", 1)[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    return (match.group(1) if match else paragraph).removesuffix(".")


def _entry(indent: int, name: str, description: str) -> list[str]:
    head = " " * indent + name
    if len(head) >= NAME_COLUMN - 1:
        lines, first = [head], ""
    else:
        lines, first = [], head.ljust(NAME_COLUMN - 1) + " "
    wrapped = textwrap.wrap(description, WIDTH - NAME_COLUMN) or [""]
    lines.append((first or " " * NAME_COLUMN) + wrapped[0])
    lines += [" " * NAME_COLUMN + line for line in wrapped[1:]]
    return [line.rstrip() for line in lines]


def _folder(folder: Path, label: str, indent: int) -> list[str]:
    init = folder / "__init__.py"
    lines = _entry(indent, label, first_sentence(init) if init.exists() else "")
    modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
    for module in modules:
        lines += _entry(indent + 2, module.name, first_sentence(module))
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        lines += _folder(sub, sub.name + "/", indent + 2)
    return lines


def generated_map(root: Path = ROOT) -> str:
    """The fenced block docs/layout.md holds between its markers."""
    lines: list[str] = []
    for package in PACKAGES:
        lines += _folder(root / package, package + "/", 0)
    return "\n".join([BEGIN, "```text", *lines, "```", END])


def page_with_map(page: str, root: Path = ROOT) -> str:
    """`page` with the block between its markers made anew."""
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + generated_map(root) + page[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    fresh = page_with_map(page)
    if args.check:
        return 0 if fresh == page else 1
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
