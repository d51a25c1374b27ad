"""How many threads torch may use on a CPU: the cores other processes leave idle, re-measured.

OpenMP's worker threads spin while they wait for work (libgomp's default). That is the fastest
setting on a quiet machine, and a collapse on a shared one: with two torch threads on 2 cores and
one foreign busy process, each parallel region waits for a thread the kernel has descheduled
(16 x 64 tokens: 130 -> 6.5 tok/s). Waiting passively (`OMP_WAIT_POLICY=PASSIVE`, our previous
default) holds up under load but wakes a sleeping thread for every matmul: a SmolLM2 decode step
with an adapter took 159 ms instead of 79 on a quiet machine, and the train_step benchmark's
generation 5.1 s instead of 3.5 (BENCHMARKS.md, "Serving under load").

So the engine keeps the spin default and runs on as many threads as there are cores left idle
by other processes: every `interval` seconds a daemon thread reads the busy time of the cores
it may run on (`/proc/stat`) and subtracts its own process's and its children's (`/proc/<pid>/
stat`; vLLM's processes are our children under `--engine vllm`). On a quiet 2-core machine that
is 2 threads; with one busy process, 1 (a single thread never waits on another, and decode
is memory-bound: 1 thread costs ~25% on a quiet machine, against ~80% lost by two under load).
Fewer threads are taken at once; more only after two readings agree, so a short burst from the
client does not make it flap. Where `/proc` is missing (macOS), the count stays fixed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger("art_backend.threads")

INTERVAL_S = 0.5
# Round the idle cores up from this fraction: 1.6 idle cores (0.4 foreign) still run 2 threads.
ROUND_UP_FROM = 0.5


def _cpu_ticks(stat_text: str, cpus: set[int]) -> int:
    """Busy ticks (user, nice, system, irq, softirq, steal) summed over `cpus` in /proc/stat."""
    busy = 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            cpu = int(name[3:])
        except ValueError:
            continue
        if cpu not in cpus:
            continue
        fields = [int(value) for value in rest.split()]
        user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
        steal = fields[7] if len(fields) > 7 else 0  # another VM on our core is load too
        busy += user + nice + system + irq + softirq + steal
    return busy


def _process_ticks(stat_text: str) -> int:
    """CPU ticks of a process from its /proc/<pid>/stat line: all its threads (utime, stime)
    and its children that have exited and been waited for (cutime, cstime)."""
    fields = stat_text.rpartition(")")[2].split()
    return sum(int(value) for value in fields[11:15])  # fields 14-17 of proc(5), after comm


def _descendants(proc: Path, pid: str) -> list[str]:
    """Live child processes of `pid`, recursively (empty where the kernel does not list them)."""
    found: list[str] = []
    try:
        tasks = list((proc / pid / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(proc, child)]
    return found


def _reading(
    proc: Path, cpus: set[int], clock: Callable[[], float]
) -> tuple[float, int, int] | None:
    """(time, busy ticks of `cpus`, ticks of this process and its children), None without /proc."""
    try:
        machine = (proc / "stat").read_text()
        ours = _process_ticks((proc / "self" / "stat").read_text())
    except OSError:
        return None
    # Our children are ours too (vLLM's processes under --engine vllm): they are part of
    # the same job, and the trainer runs while they idle.
    for child in _descendants(proc, "self"):
        with contextlib.suppress(OSError, ValueError):
            ours += _process_ticks((proc / child / "stat").read_text())
    return clock(), _cpu_ticks(machine, cpus), ours


def foreign_cores(window: float, proc: Path = Path("/proc")) -> float | None:
    """Cores other processes kept busy, over `window` seconds, on the CPUs this process may use;
    None where /proc is missing. The governor's measurement, taken once."""
    cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    before = _reading(proc, cpus, time.monotonic)
    if before is None:
        return None
    time.sleep(window)
    after = _reading(proc, cpus, time.monotonic)
    if after is None or after[0] <= before[0]:
        return None
    foreign = max(0, (after[1] - before[1]) - (after[2] - before[2]))
    return foreign / os.sysconf("SC_CLK_TCK") / (after[0] - before[0])


class ThreadGovernor:
    """Picks torch's intra-op thread count; `apply()` runs in each thread that computes.

    torch's count is per thread for OpenMP (and global for MKL), so the engine thread and the
    trainer thread each apply the current decision before their work.
    """

    def __init__(
        self,
        max_threads: int | None = None,
        *,
        interval: float = INTERVAL_S,
        proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads = max(1, max_threads or torch.get_num_threads())
        self.interval = interval
        self._proc = proc
        self._clock = clock
        self._cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self._ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._lock = threading.Lock()
        self._local = threading.local()
        self.threads = self.max_threads
        self.foreign_cores = 0.0
        self.changes_total = 0
        self._raise_votes = 0
        self._sampler: threading.Thread | None = None
        self._stopped = threading.Event()
        self._last = self._read()
        self.enabled = self._last is not None and self.max_threads > 1

    def _read(self) -> tuple[float, int, int] | None:
        return _reading(self._proc, self._cpus, self._clock)

    def start(self) -> ThreadGovernor:
        """Re-measure every `interval` seconds on a daemon thread, so a decision is never staler
        than that (a trainer starting right after a burst of generation reads the present)."""
        if self.enabled and self._sampler is None:
            self._sampler = threading.Thread(target=self._sample_forever, daemon=True)
            self._sampler.name = "art-thread-governor"
            self._sampler.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _sample_forever(self) -> None:
        while not self._stopped.wait(self.interval):
            self.sample()

    def current(self) -> int:
        """The thread count in force now."""
        return self.threads

    def sample(self) -> int:
        """Measure the foreign load since the last reading and decide again."""
        if not self.enabled:
            return self.threads
        with self._lock:
            reading = self._read()
            assert self._last is not None
            if reading is None or reading[0] - self._last[0] <= 0:
                return self.threads
            (then, busy_then, ours_then), (now, busy, ours) = self._last, reading
            self._last = reading
            foreign_ticks = max(0, (busy - busy_then) - (ours - ours_then))
            self.foreign_cores = foreign_ticks / self._ticks_per_second / (now - then)
            self._decide(self.foreign_cores)
            return self.threads

    def _decide(self, foreign_cores: float) -> None:
        idle = len(self._cpus) - foreign_cores
        wanted = max(1, min(self.max_threads, int(idle + 1 - ROUND_UP_FROM)))
        if wanted < self.threads:
            self._change(wanted)
        elif wanted > self.threads:
            self._raise_votes += 1
            if self._raise_votes >= 2:
                self._change(wanted)
        else:
            self._raise_votes = 0

    def _change(self, threads: int) -> None:
        logger.debug(
            "torch threads %d -> %d (%.2f cores busy outside)",
            self.threads,
            threads,
            self.foreign_cores,
        )
        self.threads, self._raise_votes = threads, 0
        self.changes_total += 1

    def apply(self) -> int:
        """Set torch's thread count in the calling thread to the current decision."""
        threads = self.threads
        if getattr(self._local, "threads", None) != threads:
            torch.set_num_threads(threads)
            self._local.threads = threads
        return threads
