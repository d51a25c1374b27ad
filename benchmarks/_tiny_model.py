"""The test suite's tiny random model for the benchmarks that measure our overhead on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_tiny_model(folder: Path) -> Path:
    """Build it into `folder` in a child process (the benchmark's own process stays torch-free)."""
    subprocess.run(
        [sys.executable, "-m", "tests.support.tiny_model", str(folder)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return folder
