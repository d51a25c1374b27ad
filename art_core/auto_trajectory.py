"""ART's `art.auto_trajectory` (before 0.5): `auto_trajectory()` and `capture_auto_trajectory()`,
deprecated there in favour of `current_trajectory()` and `trajectory()`, which they call here."""

from __future__ import annotations

import warnings
from collections.abc import Coroutine
from typing import Any

from art_core.capture import current_trajectory, trajectory
from art_core.trajectories import Trajectory

__all__ = ["auto_trajectory", "capture_auto_trajectory"]


def auto_trajectory(*, required: bool = False) -> Trajectory | None:
    """The open capture scope's trajectory: `art.current_trajectory(require=required)`."""
    warnings.warn(
        "auto_trajectory() is ART's old name: use art.current_trajectory(require=...).",
        DeprecationWarning,
        stacklevel=2,
    )
    return current_trajectory(require=required)


async def capture_auto_trajectory(coroutine: Coroutine[Any, Any, Any]) -> Trajectory:
    """Run `coroutine` and return its captured trajectory: `await art.trajectory(coroutine)`."""
    warnings.warn(
        "capture_auto_trajectory() is ART's old name: use `await art.trajectory(coroutine)`.",
        DeprecationWarning,
        stacklevel=2,
    )
    return await trajectory(coroutine)
