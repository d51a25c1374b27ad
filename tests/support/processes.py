"""Servers in child processes (MCP servers over HTTP, for the tests and the benchmarks)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

STARTUP_TIMEOUT_SECONDS = 30.0


@contextlib.contextmanager
def http_server_process(command: list[str], port: int, log_dir: Path) -> Iterator[None]:
    """Run `command` (a server on 127.0.0.1:`port`) until the block ends; its log in `log_dir`."""
    log_path = log_dir / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_listening(process, port, log_path)
        yield
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; its stdin closed first (a stdio server exits on EOF)."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_until_listening(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    """Return once 127.0.0.1:`port` accepts connections; fail with the server's log otherwise."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"the server did not start on port {port}:\n{log_path.read_text()}")


def art_server_refusal(*args: str, timeout: float = 120) -> str:
    """Run `art-server ARGS`, expect the clean refusal (exit 2, no traceback); its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "art_backend.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr
