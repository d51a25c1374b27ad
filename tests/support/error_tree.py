"""Reads the exception tree an errors module draws in its docstring, for the tests that hold
the drawing against the classes (`art_backend._errors`, `art_core.errors`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType

_NAME = re.compile(r"^(?P<lead>[\s│├└─]*)(?P<name>[A-Z]\w+)\b")


def drawn_tree(module: ModuleType) -> dict[str, str | None]:
    """class name -> the name it hangs under in the module's ```text``` drawing (None: a root)."""
    doc = module.__doc__ or ""
    drawing = doc.split("```text", 1)[1].split("```", 1)[0]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (depth, name) of the open branches
    for line in drawing.splitlines():
        match = _NAME.match(line)
        if not match or (match["lead"] and not set(match["lead"]) & set("├└")):
            continue  # a blank line or a description's continuation
        depth = len(match["lead"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match["name"]] = stack[-1][1] if stack else None
        stack.append((depth, match["name"]))
    return parents


def exception_classes_defined(folder: Path) -> dict[str, Path]:
    """Each class under `folder` whose bases name an exception (`...Error`, `...Exception`)."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
            if any(re.search(r"(Error|Exception|TooLarge)$", base) for base in bases):
                found[node.name] = path
    return found
