"""What machine a benchmark ran on: CPU, Python, the versions of the packages it measures."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any


def cpu_field(name: str) -> str:
    """A field of /proc/cpuinfo's first CPU ("model name", "flags"), or "" where there is none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    return ""


def machine_info(*packages: str, **extra: Any) -> dict[str, Any]:
    """CPU count and model, Python, each package's installed version, the date, and `extra`."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_field("model name") or platform.processor(),
        "python": platform.python_version(),
        **{package: version(package) for package in packages},
        **extra,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
