"""Python source read as a syntax tree, for the tests that read the house's own code."""

from __future__ import annotations

import ast
import threading
from pathlib import Path


def parse_file(path: Path) -> ast.Module:
    """`ast.parse` of the file at `path`. CPython 3.11 before 3.11.8 can raise a spurious
    `SystemError: AST constructor recursion depth mismatch` once a thread's recursion count is
    off (python/cpython#106905: hypothesis changes the recursion limit during its runs, and the
    suite's servers run in threads); a new thread starts with its own count, so the parse is
    done again on one."""
    source = path.read_text()
    try:
        return ast.parse(source, str(path))
    except SystemError as error:
        if "recursion depth mismatch" not in str(error):
            raise
    parsed: list[ast.Module] = []
    thread = threading.Thread(target=lambda: parsed.append(ast.parse(source, str(path))))
    thread.start()
    thread.join()
    if not parsed:
        raise AssertionError(f"{path} did not parse on a fresh thread either")
    return parsed[0]
