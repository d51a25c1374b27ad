"""Capture: completions made inside `art.trajectory()` (any client, any thread) land in one
trajectory, with the exact tokens the server recorded for them."""

from art_core.capture._records import trajectory_from_records
from art_core.capture._scopes import current_trajectory, no_capture, trajectory, trajectory_group
from art_core.errors import NoTrajectoryError

__all__ = [
    "NoTrajectoryError",
    "current_trajectory",
    "no_capture",
    "trajectory",
    "trajectory_from_records",
    "trajectory_group",
]
