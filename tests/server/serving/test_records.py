"""Completion records: bounded memory, evictions counted, rollouts handed over once."""

from __future__ import annotations

import time

import pytest

from art_backend._errors import InvalidNameError
from art_backend.serving._records import CompletionRecords, validate_rollout_id


def record(completion_id: str, rollout_id: str | None = None, age: float = 0.0) -> dict:
    return {"id": completion_id, "rollout_id": rollout_id, "recorded_at": time.time() - age}


def test_records_are_found_by_completion_and_rollout():
    records = CompletionRecords()
    records.add(record("a", "r1"))
    records.add(record("b", "r1"))
    records.add(record("c"))
    assert records.get("c")["id"] == "c"
    assert [r["id"] for r in records.rollout("r1")] == ["a", "b"]
    assert records.rollout("unknown") == []


def test_cap_evicts_oldest_first_and_counts():
    records = CompletionRecords(max_records=2)
    for name in "abc":
        records.add(record(name, "r"))
    assert records.get("a") is None
    assert [r["id"] for r in records.rollout("r")] == ["b", "c"]
    assert records.evictions == 1 and len(records) == 2


def test_ttl_evicts_old_records_and_counts():
    records = CompletionRecords(ttl_seconds=60)
    records.add(record("old", "r", age=120))
    records.add(record("new", "r"))
    assert records.get("old") is None and records.get("new") is not None
    assert records.evictions == 1


def test_pop_rollout_hands_records_over_once_without_counting_evictions():
    records = CompletionRecords()
    records.add(record("a", "r"))
    assert [r["id"] for r in records.pop_rollout("r")] == ["a"]
    assert records.pop_rollout("r") == [] and records.get("a") is None
    assert records.evictions == 0


@pytest.mark.parametrize("good", ["r1", "run-3.step_2:group-4", "A" * 128])
def test_valid_rollout_ids(good):
    assert validate_rollout_id(good) == good


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "a b", "-x", "A" * 129])
def test_invalid_rollout_ids(bad):
    with pytest.raises(InvalidNameError, match="rollout id"):
        validate_rollout_id(bad)


def test_a_discarded_rollout_is_released_and_late_records_for_it_are_counted_not_kept():
    records = CompletionRecords()
    records.add(record("a", "failed"))
    records.add(record("b", "kept"))
    assert [r["id"] for r in records.discard_rollout("failed")] == ["a"]
    records.add(record("late", "failed"))  # a request the client cancelled finished anyway
    assert records.get("late") is None and records.rollout("failed") == []
    assert records.discarded == 2 and records.evictions == 0
    assert [r["id"] for r in records.rollout("kept")] == ["b"]
