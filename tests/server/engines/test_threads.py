"""The thread governor: torch runs on the cores other processes leave idle (engines/_threads.py).

Two spinning OpenMP threads on 2 cores collapse when a foreign process takes a core; one thread
does not (BENCHMARKS.md, "Serving under load"). The decision is read from /proc: a fake /proc
pins the rule down, and real busy processes check the accounting (ours or foreign) against their
own ticks, so the verdicts hold whatever else the machine runs (`make test-busy`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from art_backend.engines._thread_settings import max_threads, parse_threads, thread_governor
from art_backend.engines._threads import ThreadGovernor, _cpu_ticks, _process_ticks
from art_backend.testing import InvalidRequestError
from tests.support.processes import art_server_refusal
from tests.support.servers import running_server

CPUS = sorted(os.sched_getaffinity(0))


class FakeProc:
    """A /proc folder whose numbers the test moves: cores' busy ticks and our process's ticks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "self").mkdir(parents=True)
        self.busy = dict.fromkeys(CPUS, 0)
        self.ours = 0
        self.now = 0.0
        self.write()

    def write(self) -> None:
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        lines += [f"cpu{cpu} {busy} 0 0 1000 0 0 0 0 0 0" for cpu, busy in self.busy.items()]
        lines.append(f"cpu{max(CPUS) + 1} 99999 0 0 0 0 0 0 0 0 0")  # not ours: ignored
        fields = ["S"] + ["0"] * 10 + [str(self.ours), "0"] + ["0"] * 30
        # Written whole and renamed: a sampler thread may read while the test moves the numbers.
        for path, text in [
            (self.root / "stat", "\n".join(lines) + "\nintr 1 2 3\n"),
            (self.root / "self" / "stat", f"42 (art (server) x) {' '.join(fields)}\n"),
        ]:
            path.with_suffix(".new").write_text(text)
            path.with_suffix(".new").replace(path)

    def advance(self, seconds: float, *, foreign_cores: float, our_cores: float) -> None:
        """`seconds` pass with that many cores busy outside and inside our process."""
        ticks = lambda cores: round(cores * seconds * 100)  # noqa: E731
        total = ticks(foreign_cores) + ticks(our_cores)
        for index, cpu in enumerate(CPUS):  # spread the busy ticks over our cores
            self.busy[cpu] += total // len(CPUS) + (1 if index < total % len(CPUS) else 0)
        self.ours += ticks(our_cores)
        self.now += seconds
        self.write()


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def governor_for(proc: FakeProc, max_threads: int = 2) -> ThreadGovernor:
    governor = ThreadGovernor(max_threads, proc=proc.root, clock=lambda: proc.now)
    governor._ticks_per_second = 100
    return governor


def test_proc_stat_parsing_counts_busy_ticks_of_our_cores_only():
    text = "cpu  9 9 9 9 9 9 9 9\ncpu0 10 1 2 500 7 3 4 5 0 0\ncpu1 1 1 1 1 1 1 1 1\nintr 5\n"
    assert _cpu_ticks(text, {0}) == 10 + 1 + 2 + 3 + 4 + 5  # idle and iowait left out
    assert _cpu_ticks(text, {0, 1}) == 25 + 6
    line = "42 (a (weird) name) S " + " ".join(str(i) for i in range(4, 53))
    assert _process_ticks(line) == 14 + 15 + 16 + 17  # utime, stime, cutime, cstime


@pytest.mark.skipif(len(CPUS) < 2, reason="one core: there is only ever one thread")
def test_a_foreign_busy_core_drops_to_fewer_threads_at_once_and_back_after_two_readings(proc):
    governor = governor_for(proc)
    assert governor.enabled and governor.current() == 2
    proc.advance(0.5, foreign_cores=0.2, our_cores=1.8)  # our own threads busy: still ours
    assert governor.sample() == 2
    proc.advance(0.5, foreign_cores=1.0, our_cores=0.9)
    assert governor.sample() == 1 and governor.foreign_cores == pytest.approx(1.0, abs=0.05)
    assert governor.current() == 1
    proc.advance(0.5, foreign_cores=0.0, our_cores=1.0)  # one quiet reading is not enough
    assert governor.sample() == 1
    proc.advance(0.5, foreign_cores=0.1, our_cores=1.0)
    assert governor.sample() == 2
    assert governor.changes_total == 2


def test_never_below_one_thread_and_no_time_passed_keeps_the_decision(proc):
    governor = governor_for(proc)
    proc.advance(0.5, foreign_cores=2.0, our_cores=0.0)
    assert governor.sample() == 1
    assert governor.sample() == 1  # the clock did not move: nothing to measure


def test_one_allowed_thread_or_no_proc_means_no_governing(proc, tmp_path: Path):
    assert not governor_for(proc, max_threads=1).enabled
    missing = ThreadGovernor(2, proc=tmp_path / "nowhere")
    assert not missing.enabled and missing.current() == 2


def busy_orphan() -> int:
    """A `while True: pass` process that is not ours: started by a child that exits at once."""
    starter = (
        "import subprocess, sys\n"
        "busy = subprocess.Popen([sys.executable, '-c', 'while True: pass'],\n"
        "    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(busy.pid)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", starter], capture_output=True, text=True, timeout=30, check=True
    )
    return int(result.stdout.strip())


def ticks_of(pid: int) -> int:
    return _process_ticks(Path(f"/proc/{pid}/stat").read_text())


def governor_and_process_ticks(governor: ThreadGovernor, pid: int) -> tuple[int, int, int]:
    """Over one second: the machine's busy ticks, those the governor calls ours, and `pid`'s.

    The real tests compare the governor's accounting with the busy process's own ticks read in
    the same window, never with a share of the machine, so what else runs cannot move the verdict
    (on a loaded machine the process gets less of a core, and both sides see that).
    """
    time.sleep(0.3)  # the process is up and computing
    reading, process = governor._read(), ticks_of(pid)
    time.sleep(1.0)
    later, process_later = governor._read(), ticks_of(pid)
    assert reading is not None and later is not None
    return later[1] - reading[1], later[2] - reading[2], process_later - process


# Tick counts: USER_HZ (100 a second). The per-core and per-process counters are sampled apart,
# so a few ticks of slack; a busy process gets ticks even on a loaded machine.
SLACK_TICKS = 5
SOME_TICKS = 10


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads the kernel's /proc")
def test_a_real_busy_process_that_is_not_ours_is_foreign_load():
    governor = ThreadGovernor(2)
    busy = busy_orphan()
    try:
        machine, ours, orphan = governor_and_process_ticks(governor, busy)
    finally:
        os.kill(busy, signal.SIGKILL)
    assert orphan >= SOME_TICKS
    assert ours < orphan / 2, (ours, orphan)  # the orphan's ticks are not ours
    assert machine - ours >= 0.8 * orphan - SLACK_TICKS, (machine, ours, orphan)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads the kernel's /proc")
def test_our_own_busy_child_is_counted_as_ours():
    """vLLM's processes are our children under --engine vllm: part of the job, not a neighbour."""
    governor = ThreadGovernor(2)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _machine, ours, child_ticks = governor_and_process_ticks(governor, child.pid)
    finally:
        child.kill()
        child.wait()
    assert child_ticks >= SOME_TICKS
    assert ours >= 0.8 * child_ticks - SLACK_TICKS, (ours, child_ticks)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two cores to see one taken")
def test_the_sampler_thread_applies_its_decision_to_the_computing_thread(proc):
    governor = ThreadGovernor(2, interval=0.05, proc=proc.root, clock=lambda: proc.now)
    governor._ticks_per_second = 100
    governor.start()  # readings on its own thread; the fake clock moves only when we say
    try:
        proc.advance(0.5, foreign_cores=1.0, our_cores=0.5)
        deadline = time.monotonic() + 30  # a bound on the wait, not a performance assertion
        while governor.current() != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert governor.current() == 1, governor.foreign_cores
        governor.apply()  # this thread now computes on one thread
        assert torch.get_num_threads() == 1
    finally:
        governor.stop()
        torch.set_num_threads(len(CPUS))


def test_threads_argument_is_auto_or_a_positive_number():
    assert parse_threads("auto") is None
    assert parse_threads("3") == 3
    for bad in ["0", "-1", "two", ""]:
        with pytest.raises(InvalidRequestError, match="--threads must be auto or a positive"):
            parse_threads(bad)
    assert thread_governor(None, "cuda") is None  # the GPU computes
    assert isinstance(thread_governor(None, "cpu"), ThreadGovernor)


def test_art_server_refuses_a_bad_threads_value_before_loading_anything():
    refusal = art_server_refusal("--model", "/no/such/model", "--threads", "x", timeout=60)
    assert "--threads must be auto or a positive number, not 'x'" in refusal


def test_a_thread_count_past_4_per_core_is_refused_before_torch_crashes_on_it():
    refusal = art_server_refusal("--model", "/no/such/model", "--threads", "100000", timeout=60)
    assert f"--threads 100000 is more than {max_threads()} (4 per core" in refusal
    assert parse_threads(str(max_threads())) == max_threads()


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-batch-size", "0", "0 is less than 1"),
        ("--max-batch-tokens", "many", "'many' is not a whole number"),
    ],
)
def test_batch_bounds_below_one_or_not_numbers_are_refused(flag: str, value: str, says: str):
    refusal = art_server_refusal("--model", "/no/such/model", flag, value, timeout=60)
    assert flag in refusal and says in refusal


def test_the_server_reports_its_threads_on_metrics(tiny_model_dir, tmp_path):
    with running_server(tiny_model_dir, tmp_path) as server:
        metrics = server.metrics()
        assert 1 <= metrics["art_torch_threads"] <= len(CPUS)
        assert metrics["art_foreign_cores"] >= 0
        assert "art_torch_thread_changes_total" in metrics
        health = httpx.get(f"{server.url}/health").json()
        assert health["engine"] == "torch"
