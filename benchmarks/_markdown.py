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


def publish(result: dict, results_path: Path, start: str, end: str, section: str) -> None:
    """Print the section, write the JSON results and the BENCHMARKS.md section."""
    import json

    print(section)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(result, indent=2) + "\n")
    write_section(start, end, section)
