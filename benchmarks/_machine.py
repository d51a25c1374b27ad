"""What machine a benchmark ran on: CPU, Python, the versions of the packages it measures."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import subprocess
import time
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


def checkout_commit(checkout: str | Path) -> str:
    """The short commit of the git checkout `checkout` (a baseline), else its path as given."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or str(checkout)


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


class OtherLoad:
    """`with OtherLoad() as load:` ... `load.cores`: mean CPU cores used by processes outside this
    one's tree while the block ran (the machine is shared; record it beside each figure).

    Ours = this process and its children, live ones sampled at the end and waited-for ones
    through the children times the kernel adds to their parent.
    """

    def __enter__(self) -> OtherLoad:
        self._start = (time.monotonic(), _system_busy(), _tree_cpu())
        self.cores = 0.0
        return self

    def __exit__(self, *_: object) -> None:
        wall, busy, tree = time.monotonic(), _system_busy(), _tree_cpu()
        elapsed = max(wall - self._start[0], 1e-9)
        self.cores = max(0.0, ((busy - self._start[1]) - (tree - self._start[2])) / elapsed)


def _system_busy() -> float:
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _tree_cpu() -> float:
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, children_user, children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total
