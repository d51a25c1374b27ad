"""Samplers' stability records: a sequence is kept a day after its last use, and the least
recently used go first past the bound (`tinker._stability`)."""

from __future__ import annotations

import pytest

from art_backend._errors import InvalidRequestError
from art_backend.tinker._stability import RECORD_SECONDS, StabilityRecords


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_record_lasts_a_day_after_its_last_use():
    clock = Clock()
    records = StabilityRecords(clock=clock)
    records.record("a", [1, 2], [3, 4], [-0.5, -0.25])
    clock.now = RECORD_SECONDS - 1
    assert records.use("a", "data[0]").logprobs.tolist() == [-0.5, -0.25]  # restarts its day
    clock.now = 2 * RECORD_SECONDS - 2
    assert records.use("a", "data[0]").tokens.tolist() == [3, 4]
    clock.now += RECORD_SECONDS
    with pytest.raises(InvalidRequestError, match="data\\[0\\] names sequence 'a'"):
        records.use("a", "data[0]")
    assert records.tokens == 0


def test_the_least_recently_used_go_first_past_the_bound():
    records = StabilityRecords(clock=Clock(), max_tokens=8)
    records.record("a", [1, 2], [3, 4], [0.0, 0.0])
    records.record("b", [1, 2], [3, 4], [0.0, 0.0])
    records.use("a", "data[0]")
    records.record("c", [1, 2], [3, 4], [0.0, 0.0])  # 12 tokens: b, the least recent, goes
    assert list(records.sequences) == ["a", "c"] and records.tokens == 8
