"""`--threads`: the count parsed, and the governor that gives the torch engine (each replica its
share) the cores other processes leave idle (`_threads.py`). torch is imported only when called.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from art_backend._errors import InvalidRequestError

if TYPE_CHECKING:
    from art_backend.engines._threads import ThreadGovernor


def max_threads() -> int:
    """The most torch threads a count may fix: 4 per core, at least 256. Far more crashes the
    process (torch's thread pool segfaults asked for 100,000), with no message."""
    return max(256, 4 * (os.cpu_count() or 1))


def parse_threads(threads: str) -> int | None:
    """`--threads`: None for auto, else the fixed count; anything else is a clear error."""
    if threads == "auto":
        return None
    if not threads.isdigit() or int(threads) < 1:
        raise InvalidRequestError(f"--threads must be auto or a positive number, not {threads!r}")
    if int(threads) > max_threads():
        raise InvalidRequestError(
            f"--threads {threads} is more than {max_threads()} (4 per core, at least 256): "
            "give a count near the number of cores, or auto."
        )
    return int(threads)


def thread_governor(fixed: int | None, device: str, replicas: int = 1) -> ThreadGovernor | None:
    """Auto follows the cores other processes leave idle (CPU only); a number fixes the count.

    With torch-engine replicas in this process, each decodes on its share of the cores: two
    sets of spinning OpenMP threads on the same cores would wait on each other."""
    import torch

    from art_backend.engines._threads import ThreadGovernor

    if fixed is not None:
        torch.set_num_threads(fixed)
        return None
    if device != "cpu":
        return None  # the GPU computes; torch's CPU threads only feed it
    if replicas > 1:
        return ThreadGovernor(max(1, torch.get_num_threads() // replicas)).start()
    return ThreadGovernor().start()


def share_of(governor: ThreadGovernor) -> ThreadGovernor:
    """Another replica's governor, with the same share of the cores."""
    from art_backend.engines._threads import ThreadGovernor

    return ThreadGovernor(governor.max_threads).start()
