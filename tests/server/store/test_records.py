"""Completion records: bounded memory, evictions counted, rollouts handed over once."""

from __future__ import annotations

import time

import pytest

from art_backend.store._records import CompletionRecords, estimated_bytes, validate_rollout_id
from art_backend.testing import InvalidNameError


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


def big_record(completion_id: str, rollout_id: str | None = None, size: int = 10_000) -> dict:
    return {**record(completion_id, rollout_id), "request": {"metadata": "m" * size}}


def test_records_are_counted_in_bytes_and_released_when_discarded():
    records = CompletionRecords()
    records.add(big_record("a", "r", size=100_000))
    assert records.bytes >= 100_000 and records.bytes == estimated_bytes(records.get("a"))
    records.discard_rollout("r")
    assert records.bytes == 0


def test_byte_cap_evicts_oldest_first_and_counts():
    records = CompletionRecords(max_bytes=35_000)
    for name in "abcd":
        records.add(big_record(name, "r"))  # ~10 KB each: three fit
    assert records.get("a") is None
    assert [r["id"] for r in records.rollout("r")] == ["b", "c", "d"]
    assert records.evictions == 1 and records.byte_evictions == 1
    assert records.bytes <= 35_000


def test_a_record_larger_than_the_whole_byte_cap_is_counted_and_evicts_no_other():
    records = CompletionRecords(max_bytes=5_000)
    records.add(big_record("small", size=100))
    records.add(big_record("huge", size=50_000))
    assert records.get("huge") is None and records.get("small") is not None
    assert records.evictions == 1 and records.byte_evictions == 1
    assert records.bytes == estimated_bytes(records.get("small"))


def test_discarded_rollouts_release_their_bytes():
    records = CompletionRecords()
    records.add(big_record("a", "failed"))
    records.add(big_record("b", "kept"))
    records.discard_rollout("failed")
    assert records.bytes == estimated_bytes(records.get("b"))


def test_size_estimate_follows_string_length_and_container_contents():
    assert estimated_bytes("x" * 1_000_000) >= 1_000_000
    tokens = list(range(1_000, 3_000))
    assert estimated_bytes({"token_ids": tokens}) >= 2_000 * 28  # an int object each


def test_big_anonymous_records_never_evict_a_rollout_waiting_for_its_train_step():
    """Six large requests without a rollout once evicted every record a trainer was about to
    use: under the budget, records without a rollout id go first."""
    records = CompletionRecords(max_bytes=60_000)
    for index in range(4):
        records.add(big_record(f"turn-{index}", "rollout-1", size=2_000))
    for index in range(6):
        records.add(big_record(f"big-{index}", size=20_000))
    assert [r["id"] for r in records.rollout("rollout-1")] == [f"turn-{i}" for i in range(4)]
    assert records.get("big-0") is None and records.get("big-5") is not None
    assert records.eviction_reason("big-0") == "the record store was full (60,000 bytes)"
    assert records.bytes <= 60_000


def test_released_records_go_before_those_still_waiting():
    records = CompletionRecords(max_records=3)
    records.add(record("trained", "r1"))
    records.add(record("waiting", "r2"))
    records.add(record("also-waiting", "r3"))
    records.release(["trained"])
    records.add(record("new", "r4"))
    assert records.get("trained") is None and records.get("waiting") is not None
    assert records.eviction_reason("trained") == "the record store was full (3 records)"


def test_rollouts_alone_over_the_budget_still_evict_their_oldest():
    records = CompletionRecords(max_records=2)
    for name in "abc":
        records.add(record(name, "r"))
    assert records.get("a") is None and records.eviction_reason("a") is not None


def test_an_expired_record_is_gone_on_the_next_read_without_a_new_record():
    records = CompletionRecords(ttl_seconds=60)
    records.add(record("old", "r", age=30))
    records.add(record("new", "r"))
    records._records["old"]["recorded_at"] -= 45  # time passes: 75 s old now, nothing added
    assert len(records) == 1 and records.get("old") is None
    assert records.eviction_reason("old") == "older than 60 s"
    assert records.eviction_reason("never-stored") is None


def test_a_released_record_past_its_time_goes_though_younger_ones_were_released_before_it():
    records = CompletionRecords(ttl_seconds=60)
    records.add(record("first", "r1", age=30))
    records.add(record("second", "r2", age=20))
    records.release(["second"])
    records.release(["first"])  # released last, yet the oldest: the time limit still finds it
    records._records["first"]["recorded_at"] -= 45
    assert records.get("first") is None and records.get("second") is not None
