"""Processes for the serving benchmark: ports, server starts and stops, foreign busy load, the
server's peak RSS, and the machine's own load before and during a run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _serve_settings import STARTUP_TIMEOUT, STOP_TIMEOUT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_BUSY_PIDS: set[int] = set()  # never counted as a contender's own CPU use


class BusyLoad:
    """`--busy N`: N foreign `while True: pass` processes, running only during each timed run."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._processes: list[subprocess.Popen] = []
        self._started = 0.0

    def start(self) -> None:
        for _ in range(self.count):
            process = subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], start_new_session=True
            )
            self._processes.append(process)
            _BUSY_PIDS.add(process.pid)
        self._started = time.perf_counter()

    def stop(self) -> float | None:
        """Stop them; returns the CPU cores they used meanwhile (None when there are none)."""
        if not self._processes:
            return None
        import psutil

        wall = time.perf_counter() - self._started
        cpu = 0.0
        for process in self._processes:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(process.pid).cpu_times()
                cpu += times.user + times.system
            process.kill()
            process.wait(10)
            _BUSY_PIDS.discard(process.pid)
        self._processes = []
        return round(cpu / wall, 2) if wall > 0 else None


class RssSampler:
    """Peak resident memory of a process and its children, sampled every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak_bytes = 0
        self.window_peak_bytes = 0  # peak since the last `reset_window`
        self.samples = 0
        self.seen: dict[int, Any] = {}  # every process of the tree, to end leftovers at the end

    def _tree(self) -> list[Any]:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except self._psutil.Error:
            return []
        return [process for process in processes if process.pid not in _BUSY_PIDS]

    def _sample(self) -> int:
        total = 0
        processes = self._tree()
        for process in processes:
            self.seen.setdefault(process.pid, process)
            with contextlib.suppress(self._psutil.Error):
                total += process.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self._sample()
            self.peak_bytes = max(self.peak_bytes, rss)
            self.window_peak_bytes = max(self.window_peak_bytes, rss)
            self.samples += 1
            self._stop.wait(self._interval)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def reset_window(self) -> None:
        self.window_peak_bytes = 0

    def kill_leftovers(self) -> list[int]:
        """SIGKILL what is left of the tree after its root stopped (vLLM's engine workers)."""
        killed = []
        for pid, process in self.seen.items():
            with contextlib.suppress(self._psutil.Error):
                if process.is_running() and process.status() != self._psutil.STATUS_ZOMBIE:
                    process.kill()
                    killed.append(pid)
        return killed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def cpu_snapshot(self) -> tuple[float, float, float]:
        """(time, CPU seconds busy on the whole machine, CPU seconds of the tree and of us)."""
        times = self._psutil.cpu_times()
        busy = sum(
            getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq")
        )
        ours = 0.0
        processes = self._tree()
        processes.append(self._psutil.Process())
        for process in {p.pid: p for p in processes}.values():
            with contextlib.suppress(self._psutil.Error):
                cpu = process.cpu_times()
                ours += cpu.user + cpu.system
        return time.perf_counter(), busy, ours


def other_load(start: tuple[float, float, float], end: tuple[float, float, float]) -> float:
    """Mean CPU cores used by processes outside this benchmark between two snapshots."""
    wall = end[0] - start[0]
    if wall <= 0:
        return 0.0
    return round(max(0.0, (end[1] - start[1]) - (end[2] - start[2])) / wall, 2)


def wait_for_quiet(max_wait: float = 60.0, threshold: float = 25.0) -> dict[str, float]:
    """Before loading a contender, wait (bounded) until other processes leave the CPUs mostly idle.

    The machine is shared; this does not make it quiet, it only avoids starting in a burst.
    """
    import psutil

    started = time.perf_counter()
    quiet = 0
    percent = psutil.cpu_percent(interval=1.0)
    while time.perf_counter() - started < max_wait:
        quiet = quiet + 1 if percent <= threshold else 0
        if quiet >= 3:
            break
        percent = psutil.cpu_percent(interval=1.0)
    return {
        "waited_seconds": round(time.perf_counter() - started, 1),
        "cpu_percent_before": percent,
        "loadavg_1min_before": round(os.getloadavg()[0], 2),
        "python_loop_seconds": python_loop_seconds(),
    }


def python_loop_seconds(iterations: int = 5_000_000) -> float:
    """A fixed pure-Python loop, timed just before a contender starts: how fast the shared host
    runs now (the host's other tenants do not show in the other-load check)."""
    started = time.perf_counter()
    total = 0
    for index in range(iterations):
        total += index
    return round(time.perf_counter() - started, 3)


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM the server's own process group (it was started in a new session), then SIGKILL."""
    from art_backend.testing import stop_process_group as stop_group

    stop_group(process, STOP_TIMEOUT)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def wait_healthy(base_url: str, process: subprocess.Popen, log: Path) -> float:
    import httpx

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.perf_counter() - started < STARTUP_TIMEOUT:
            if process.poll() is not None:
                raise RuntimeError(
                    f"server exited with code {process.returncode} before /health:\n{tail(log)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                response = await client.get(f"{base_url}/health")
                if response.status_code == 200:
                    return time.perf_counter() - started
            await asyncio.sleep(0.5)
    raise TimeoutError(f"no healthy /health after {STARTUP_TIMEOUT:.0f} s:\n{tail(log)}")


# ---------------------------------------------------------------------------------- workloads
