"""Start the real HTTP server on 127.0.0.1 (the tiny model by default) and talk to it."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn


@dataclass
class RunningServer:
    """A live art-server: its base URL, API key, and the app (to read engine state in tests)."""

    url: str
    api_key: str | None
    app: object
    art_path: Path

    @property
    def service(self):
        return self.app.state.service

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        return read_metrics(self.url, self.headers())


def read_metrics(url: str, headers: dict[str, str]) -> dict[str, float]:
    """GET `url`/metrics, as name -> value."""
    text = httpx.get(f"{url}/metrics", headers=headers).text
    pairs = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(
    model: Path | str,
    art_path: Path,
    *,
    api_key: str | None = None,
    name: str = "tiny",
    dtype: str = "float32",
    **kwargs,
):
    """Build the app for `model` and run uvicorn on a free 127.0.0.1 port in a thread."""
    from art_backend._settings import ServerSettings
    from art_backend.cli import build_app

    settings = ServerSettings(
        str(model), name=name, dtype=dtype, api_key=api_key, art_path=art_path, **kwargs
    )
    app = build_app(settings)
    server, thread, url = serve_in_thread(app)
    return server, thread, RunningServer(url, api_key, app, art_path)


def serve_in_thread(app, port: int | None = None) -> tuple[uvicorn.Server, threading.Thread, str]:
    """Run an ASGI app with uvicorn on 127.0.0.1 (a free port by default) in a daemon thread,
    once it accepts connections; returns the server, its thread and its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the test server on port {port} did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def running_server(model: Path | str, art_path: Path, **kwargs) -> Iterator[RunningServer]:
    """`start_server` for the length of a block; the server stops after it."""
    uv_server, thread, running = start_server(model, art_path, **kwargs)
    try:
        yield running
    finally:
        uv_server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def running_tinker_server(model: Path | str, art_path: Path, **kwargs) -> Iterator[RunningServer]:
    """`running_server` for tests that drive it with the `tinker` SDK: the SDK's telemetry off
    meanwhile (it would post it to the server, which accepts and drops it)."""
    previous = os.environ.get("TINKER_TELEMETRY")
    os.environ["TINKER_TELEMETRY"] = "0"
    try:
        with running_server(model, art_path, **kwargs) as running:
            yield running
    finally:
        if previous is None:
            os.environ.pop("TINKER_TELEMETRY", None)
        else:
            os.environ["TINKER_TELEMETRY"] = previous
