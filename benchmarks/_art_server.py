"""An art-server for a benchmark: a child process on a free port, its URL once it accepts
connections (the Tinker benchmarks' shared start)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def start_art_server(
    model: str, path: Path, key: str, *extra: str, environment: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """`art-server --model MODEL --path PATH --api-key KEY EXTRA...` on a free port, with
    `environment` added to this process's; the process and its URL once it accepts connections
    (RuntimeError if it exits or never does)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "art_backend.cli", "--model", model, "--port", str(port)]
    command += ["--path", str(path), "--api-key", key, "--log-level", "warning", *extra]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(environment or {})},
    )
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"art-server exited with {process.returncode}") from None
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("art-server did not start")
