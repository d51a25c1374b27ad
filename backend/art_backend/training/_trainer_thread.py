"""Where training's model work runs: each call on a new thread that exits after it, one at a time.

OpenMP (libgomp, torch's CPU thread pool) gives every thread that starts parallel work its own
pool of worker threads, kept while that thread lives. Once the process holds more pool workers
than cores, libgomp stops spinning in every wait and sleeps instead, which costs a futex wake per
matmul: a long-lived trainer thread beside the engine's thread made every decode step after the
first training step slower (SmolLM2, 16 rows, 2 cores: 70 -> 85-94 ms; train_step's generation
3.6 -> 5.5 s). A thread that exits takes its pool with it, so the engine spins again as soon as a
step is over.

The trainer's model work itself (`run_on_model`: a step's forward, backward and optimizer
step) goes to the torch engine's thread on a CPU instead, where the one pool is
(`engines/_loop_calls.py`: a trainer thread's second pool made the step itself twice as slow).

One call at a time, as before on a one-thread executor: glibc gives each thread a malloc arena,
and a step's ~1.5 GB of activations freed on six pool threads kept six arenas at their peak
(8.5 GB resident for SmolLM2-135M, measured); an exited thread's arena is reused by the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import threading
from typing import Any


def release_free_memory() -> None:
    """Hand memory freed by a step back to the OS (glibc keeps it otherwise); no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class TrainerThread:
    """`await run(function, ...)`: the call on a fresh thread, calls serialised;
    `run_on_model`: on `host`'s own thread where it takes calls (`run_between_steps`)."""

    def __init__(self, host: Any = None) -> None:
        self._one_at_a_time = threading.Lock()
        self._host = host

    async def run(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._call(False, function, *args, **kwargs)

    async def run_on_model(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """`run`, on the model's host thread where there is one (a torch engine on a CPU)."""
        return await self._call(True, function, *args, **kwargs)

    async def _call(self, on_host: bool, function: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if future.cancelled():
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def work() -> None:
            with self._one_at_a_time:
                try:
                    outcome = (True, function(*args, **kwargs))
                except BaseException as error:  # noqa: BLE001 (handed to the awaiting coroutine)
                    outcome = (False, error)
                finally:
                    release_free_memory()
            with contextlib.suppress(RuntimeError):  # the loop closed while we worked
                loop.call_soon_threadsafe(settle, *outcome)

        submit = getattr(self._host, "run_between_steps", None) if on_host else None
        if submit is None or not submit(work):
            # Not a daemon: the interpreter waits for a step that is writing a checkpoint.
            threading.Thread(target=work, name="art-trainer").start()
        return await future
