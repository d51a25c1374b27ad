"""The benchmark scripts' tests: each runs its script on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def tiny_run(script: str, out: Path) -> tuple[dict[str, Any], str]:
    """`benchmarks/<script> --shape tiny --out <out>` in a process of its own: its JSON and
    what it printed (the section it renders)."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--shape", "tiny", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout
