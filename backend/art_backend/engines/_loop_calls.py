"""Work handed to the torch engine's thread, run there between two decode steps.

OpenMP (libgomp, torch's CPU thread pool) gives every thread that starts parallel work a pool of
worker threads of its own. With two pools in a process whose threads fill its cores (the engine
thread's and a trainer thread's), libgomp stops spinning in its waits and sleeps instead, a futex
wake per parallel region, in both threads: a GRPO step's forward+backward run on a thread of
its own beside an engine thread took twice as long as on that thread (SmolLM2 bf16, 2 packed
rows of 147 tokens, 2-core Xeon, 2026-12-06: 1.50-1.74 s against 0.76-0.80 s; in `art-server`
the trainer took 1.8-2.5 s for steps of ~300 tokens). So on a CPU the trainer's model work
(`TrainerThread.run_on_model`) runs on the engine's own thread, in its pool, while decoding
waits; everything else a step does (checkpoint files, history) keeps a thread of its own.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)


class LoopCalls:
    """Calls queued for the engine thread: `submit` from any thread, `run_pending` on the engine
    thread. Open while that thread runs; a call submitted before `close` still runs."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._open = False
        self._wake = wake  # gets the engine thread out of its wait for requests

    def open(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        """No more calls; those already queued run now (the engine thread, as it exits)."""
        with self._lock:
            self._open = False
        self.run_pending()

    def submit(self, function: Callable[[], None]) -> bool:
        """Queue `function()` (it handles its own errors) for the engine thread; False when that
        thread does not take calls (another device, not started, stopped): run it elsewhere."""
        with self._lock:
            if not self._open:
                return False
            self._calls.put(function)
        self._wake()
        return True

    def run_pending(self) -> None:
        """Run the queued calls, with gradients on (the engine thread runs without)."""
        while True:
            try:
                function = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                with torch.enable_grad():
                    function()
            except BaseException:  # a call settles its own result; this is a bug, not a result
                logger.exception("a call on the engine thread raised")
