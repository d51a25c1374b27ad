"""Reads the exception tree an errors module draws in its docstring (`art_core.errors`,
`art_backend._errors`), so their tests hold the drawing to the classes.

A line of the drawing is an indented class name, then optionally `(Base, ...)`: the bases beside
its parent (builtins, or names the module imports), then its description.
"""

from __future__ import annotations

import builtins
import re
from types import ModuleType

TREE_LINE = re.compile(
    r"^(?P<indent> {4,})(?P<name>[A-Z]\w*)(?: \((?P<also>[A-Za-z, ]+)\))?(?:\s|$)"
)


def drawn_tree(module: ModuleType) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """class name -> (its parent in the drawing, the other bases drawn beside it)."""
    drawn: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    parents: list[tuple[int, str]] = []
    for line in (module.__doc__ or "").splitlines():
        match = TREE_LINE.match(line)
        if match is None:
            continue
        depth = len(match["indent"])
        while parents and parents[-1][0] >= depth:
            parents.pop()
        also = tuple(name.strip() for name in (match["also"] or "").split(",") if name.strip())
        drawn[match["name"]] = (parents[-1][1] if parents else None, also)
        parents.append((depth, match["name"]))
    return drawn


def drawn_bases(module: ModuleType, name: str) -> tuple[type, ...]:
    """The bases the drawing gives `name`: its parent (a root: Exception) and those beside it."""
    parent, also = drawn_tree(module)[name]
    bases = (getattr(module, parent),) if parent else ()
    bases += tuple(getattr(module, base, None) or getattr(builtins, base) for base in also)
    return bases or (Exception,)


def defined_exceptions(module: ModuleType) -> dict[str, type[BaseException]]:
    """The exception classes `module` itself defines, by name."""
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == module.__name__
    }
