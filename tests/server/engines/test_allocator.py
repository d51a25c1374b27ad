"""glibc's malloc thresholds (engines/_allocator.py): a step's growing blocks reuse freed memory
instead of faulting in fresh pages, and a user's own allocator choice is left alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from art_backend.engines import _allocator
from art_backend.engines._allocator import keep_freed_memory
from art_backend.testing import ModelLoadError

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# A decode step's float64 keys: ~4 MB, one column (512 values) longer each step.
GROWING_BLOCKS = """
import resource, sys, torch
from art_backend.engines._allocator import keep_freed_memory
if sys.argv[1] == "tuned":
    print(keep_freed_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(43):
    if step == 3:
        before = faults()
    torch.empty(2**19 + step * 512, dtype=torch.float64).fill_(1.0)
print(faults() - before)
"""


def page_faults(mode: str) -> tuple[list[str], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    env.pop("ART_MALLOC_TUNING", None)
    result = subprocess.run(
        [sys.executable, "-c", GROWING_BLOCKS, mode],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )  # fmt: skip
    lines = result.stdout.split()
    return lines[:-1], int(lines[-1])


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_growing_blocks_reuse_freed_memory() -> None:
    said, tuned = page_faults("tuned")
    assert said == ["set"]
    _, untuned = page_faults("default")
    # Untuned, each 4 MB block is mapped afresh: ~1,000 faults a block, 40 blocks.
    assert untuned > 20_000, untuned
    assert tuned * 10 < untuned, (tuned, untuned)


@pytest.fixture
def undecided(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The module as if no engine had started in this process, the user's settings cleared."""
    monkeypatch.setattr(_allocator, "_applied", None)
    for name in (*_allocator.USER_SETTINGS, "LD_PRELOAD", _allocator.SWITCH):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_switched_off(undecided: pytest.MonkeyPatch) -> None:
    undecided.setenv("ART_MALLOC_TUNING", "0")
    assert keep_freed_memory() == "switched off (ART_MALLOC_TUNING=0)"


def test_a_bad_switch_value_is_refused_by_name(undecided: pytest.MonkeyPatch) -> None:
    undecided.setenv("ART_MALLOC_TUNING", "sometimes")
    with pytest.raises(ModelLoadError, match="ART_MALLOC_TUNING='sometimes'"):
        keep_freed_memory()
    assert _allocator._applied is None  # nothing decided on a refused value


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("MALLOC_TRIM_THRESHOLD_", "1048576", "MALLOC_TRIM_THRESHOLD_"),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536", "GLIBC_TUNABLES"),
        ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "jemalloc"),
    ],
)
def test_the_users_allocator_is_left_alone(
    undecided: pytest.MonkeyPatch, name: str, value: str, named: str
) -> None:
    undecided.setenv(name, value)
    assert keep_freed_memory() == f"the user's allocator settings ({named})"


def test_decided_once(undecided: pytest.MonkeyPatch) -> None:
    undecided.setenv("ART_MALLOC_TUNING", "0")
    first = keep_freed_memory()
    undecided.setenv("ART_MALLOC_TUNING", "1")
    assert keep_freed_memory() == first  # a process's malloc is set once, at its first engine
