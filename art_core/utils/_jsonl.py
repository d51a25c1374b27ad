"""The one JSONL reader: every non-blank line of a file, parsed, or an error naming the line.

SFT files (`art_core.utils.sft`), scenario files (`art.load_scenarios`, `art_mcp`'s checked
scenarios) all read through it, so a bad byte, a line that is not JSON or a missing file reads
the same everywhere: "<path>, line <n>: <problem>".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# (message, line number or None for the file as a whole) -> the caller's named exception
Fail = Callable[[str, "int | None"], Exception]


def jsonl_lines(
    path: str | Path, fail: Fail, *, what: str = "file"
) -> Iterator[tuple[int, str, Any]]:
    """(line number, text, parsed value) of each non-blank line, in order; the first bad line
    raises `fail(message, number)`, a missing file `fail("No <what> at <path>", None)`."""
    path = Path(path)
    if not path.is_file():
        raise fail(f"No {what} at {path}", None)
    # Read as bytes and decode line by line, so a bad byte is reported with its line number.
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise fail(
                    f"{path}, line {number}: not UTF-8 text ({error.reason})", number
                ) from None
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                raise fail(
                    f"{path}, line {number}: not JSON ({error.msg} at column {error.colno})", number
                ) from None
            yield number, text, value
