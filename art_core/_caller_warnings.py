"""A warning pointed at the user's line: the first caller outside art_core, however deep the
library's own calls go (so `-W error` and the warning's file:line name the user's code)."""

from __future__ import annotations

import sys
import warnings

__all__ = ["warn_at_caller"]


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """Warn with `message`, attributed to the nearest frame outside art_core."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("art_core"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
