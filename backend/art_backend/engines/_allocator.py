"""glibc's malloc, set for a process that allocates tensors of the same few sizes every step.

glibc serves a block above its mmap threshold (128 KB at start) from pages mapped for it alone
and unmaps them when it is freed; a freed mapped block raises the threshold to its own size (up
to 32 MB). A CPU decode step's float64 keys and values (`_batch_invariant.py`: each layer's
cache cast for its attention, a few MB at 16 rows) are one column longer than the step before,
so each is a little larger than the threshold the previous step's free set: every step mapped
fresh pages, took a page fault on each 4 KB of them and unmapped them again. A training step's
activations and the logits' float32 copies did the same.

`keep_freed_memory` fixes the threshold at 32 MB (glibc's largest; larger blocks are still
mapped, as before) and lets the heap keep up to `TRIM_THRESHOLD` free at its top, so a step's
blocks come from memory the step before freed. Setting either value stops glibc adjusting both:
the threshold alone, with the trim threshold fixed at its 128 KB, made decoding twice as slow
(the heap's top went back to the OS after every step and faulted in again). Memory a training
step frees still goes back to the OS after it (`release_free_memory`, `malloc_trim`).

Measured (SmolLM2-135M bf16, 2 threads, quiet, the settings as glibc's environment variables in
alternating processes; docs/performance.md): 16 rows x 64 tokens decoded at +5 %, a GRPO
forward+backward of 16 rows x 128 tokens 6 % faster, peak RSS the same.

Left as it is: a process whose allocator the user chose (`MALLOC_*` or `GLIBC_TUNABLES` set, or
jemalloc/tcmalloc preloaded), a C library other than glibc (macOS, musl: `mallopt` differs or is
absent), and `ART_MALLOC_TUNING=0`.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

from art_backend.engines._switches import env_switch

SWITCH = "ART_MALLOC_TUNING"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 256 * 2**20
USER_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
)
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_lock = threading.Lock()
_applied: str | None = None  # why the settings are as they are, once decided


def keep_freed_memory() -> str:
    """Set glibc's thresholds (module docstring) once per process; returns what was decided:
    "set", or why not ("switched off", "the user's allocator settings", "not glibc", ...).
    A bad `ART_MALLOC_TUNING` value raises `ModelLoadError`, every time it is read."""
    global _applied
    wanted = env_switch(SWITCH, default=True)
    with _lock:
        if _applied is None:
            _applied = _decide(wanted)
        return _applied


def _decide(wanted: bool) -> str:
    if not wanted:
        return f"switched off ({SWITCH}=0)"
    chosen = [name for name in USER_SETTINGS if os.environ.get(name)]
    preloaded = os.environ.get("LD_PRELOAD", "")
    chosen += [name for name in OTHER_ALLOCATORS if name in preloaded]
    if chosen:
        return f"the user's allocator settings ({', '.join(chosen)})"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "no mallopt in libc.so.6"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    ):
        return "mallopt refused the values"
    return "set"
