"""BENCHMARKS.md sections: each benchmark rewrites only the text between its own two markers."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def write_section(start: str, end: str, section: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the text from `start` to `end` with `section` (which carries both), or append it."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        text = text.split(start, 1)[0] + section + text.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
