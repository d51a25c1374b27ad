"""What every command line of the project shares: argparse types and parsed flags handed on.

`art-server`, `art replay`, `art preflight` and `art mcp-train` import these downward (the
backend and the integrations may import art_core; this module imports argparse only, no torch):

    positive_int(text)        an argparse type: a whole number of at least 1
    non_negative_float(text)  an argparse type: a finite number of at least 0
    flag_values(args, names)  the parsed flags `names` as keywords, for a function or settings
                              object whose parameters are named like the flags
                              (`--max-batch-size` is `max_batch_size`)
"""

from __future__ import annotations

import argparse
import math
from typing import Any


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number of at least 0 (`nan`, `inf` and `-1` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is less than 0")
    return value


def flag_values(args: argparse.Namespace, names: str) -> dict[str, Any]:
    """The parsed flags `names` (space-separated destinations, e.g. "steps max_turns") as
    keywords: a command hands its options on by name without a line per flag."""
    return {name: getattr(args, name) for name in names.split()}
