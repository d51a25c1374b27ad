"""The shapes a static decode step runs in: rows and cache columns rounded up to buckets.

A static step's tensors keep their shape from one step to the next, so a compiled step (or a
GPU's captured graph) is reused instead of rebuilt: the slot cache holds `slots` rows of
`columns` tokens, and a batch of 5 rows runs as 8 slots (3 idle), 100 tokens as 128 columns.

| dimension | buckets | outside them |
|---|---|---|
| slots (rows) | 1, 2, 4, 8, 16, 32, 64 | a multiple of 64, run eager |
| columns (tokens a slot can hold) | 128, 256, 512, 1024, 2048, 4096 | a multiple of 1024, run eager |

Powers of two waste at most half a step on idle rows and at most half the attention on masked
columns (attention was 9 % of a 16-row SmolLM2 step: docs/performance.md), and keep the number
of shapes a compiler sees to 7 x 6. A shape outside the buckets is still a valid static shape;
it is only never compiled (`StepShape.bucketed` is False), so a rare 200-row batch or a 10,000-
token context costs no compile time.
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
COLUMN_BUCKETS = (128, 256, 512, 1024, 2048, 4096)
ROWS_PAST_BUCKETS = 64  # rows beyond the largest bucket round up to a multiple of this
COLUMNS_PAST_BUCKETS = 1024


@dataclass(frozen=True)
class StepShape:
    """A static step's shape: `slots` rows of `columns` tokens; `bucketed` when both are bucket
    sizes (the only shapes worth compiling)."""

    slots: int
    columns: int
    bucketed: bool

    def holds(self, rows: int, columns: int) -> bool:
        """Whether `rows` rows of up to `columns` tokens fit in this shape."""
        return rows <= self.slots and columns <= self.columns


def step_shape(rows: int, columns: int) -> StepShape:
    """The smallest bucketed shape holding `rows` rows of `columns` tokens, else the eager one."""
    if rows < 1 or columns < 1:
        raise ValueError(f"a step needs at least one row and one column, not {rows} x {columns}")
    slots, rows_bucketed = _round_up(rows, ROW_BUCKETS, ROWS_PAST_BUCKETS)
    width, columns_bucketed = _round_up(columns, COLUMN_BUCKETS, COLUMNS_PAST_BUCKETS)
    return StepShape(slots, width, rows_bucketed and columns_bucketed)


def _round_up(value: int, buckets: tuple[int, ...], past: int) -> tuple[int, bool]:
    for bucket in buckets:
        if value <= bucket:
            return bucket, True
    return -(-value // past) * past, False
