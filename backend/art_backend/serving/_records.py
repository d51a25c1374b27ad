"""Exact-token capture: every completion served is recorded under its id and its rollout id.

Eviction rule (memory stays bounded): a record is kept until (1) the trainer consumes its
rollout (`pop_rollout`), or (2) it is older than `ttl_seconds` (default 1 hour), or (3) the
store holds more than `max_records` completions (default 20,000), when the oldest go first.
Every eviction by (2) or (3) is counted in `evictions` and shown on GET /metrics, so a record
lost before training is never lost silently.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from art_backend._errors import InvalidNameError
from art_core.names import is_rollout_id


def validate_rollout_id(rollout_id: str) -> str:
    """Rollout ids are 1-128 characters of letters, digits, `.`, `_`, `:` and `-`."""
    if not is_rollout_id(rollout_id):
        raise InvalidNameError(
            f"Invalid rollout id {rollout_id[:140]!r}: use 1-128 letters, digits, '.', '_', ':' "
            "or '-', starting with a letter or digit.",
            param="rollout_id",
        )
    return rollout_id


class CompletionRecords:
    """Thread-safe store of completion records, indexed by completion id and rollout id."""

    def __init__(self, *, max_records: int = 20_000, ttl_seconds: float = 3600.0) -> None:
        self.max_records = max_records
        self.ttl_seconds = ttl_seconds
        self.evictions = 0
        self.recorded = 0
        self.discarded = 0
        self._records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._by_rollout: dict[str, list[str]] = {}
        self._discarded_rollouts: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        """Store one completion record (it must carry `id`, `recorded_at`, optional `rollout_id`)."""
        with self._lock:
            self.recorded += 1
            if record.get("rollout_id") in self._discarded_rollouts:
                self.discarded += 1
                return
            self._records[record["id"]] = record
            if record.get("rollout_id"):
                self._by_rollout.setdefault(record["rollout_id"], []).append(record["id"])
            self._evict_locked(time.time())

    def get(self, completion_id: str) -> dict[str, Any] | None:
        """The record of one completion, or None when unknown or evicted."""
        with self._lock:
            return self._records.get(completion_id)

    def get_many(self, completion_ids: list[str]) -> list[dict[str, Any]]:
        """The records of these completions that are still stored, in the order asked."""
        with self._lock:
            return [self._records[i] for i in completion_ids if i in self._records]

    def rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        """The records of one rollout, oldest first."""
        with self._lock:
            ids = self._by_rollout.get(rollout_id, [])
            return [self._records[i] for i in ids if i in self._records]

    def pop_rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        """Hand a rollout's records to the trainer and forget them (not counted as evictions)."""
        with self._lock:
            ids = self._by_rollout.pop(rollout_id, [])
            return [self._records.pop(i) for i in ids if i in self._records]

    def discard_rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        """Forget a failed rollout's records, and any that arrive for it later (a request the
        client cancelled can still finish here): counted in `discarded`, not as evictions."""
        with self._lock:
            self._discarded_rollouts[rollout_id] = time.time()
            while len(self._discarded_rollouts) > self.max_records:
                self._discarded_rollouts.popitem(last=False)
            ids = self._by_rollout.pop(rollout_id, [])
            records = [self._records.pop(i) for i in ids if i in self._records]
            self.discarded += len(records)
            return records

    def __len__(self) -> int:
        return len(self._records)

    def _evict_locked(self, now: float) -> None:
        while self._records:
            oldest_id, oldest = next(iter(self._records.items()))
            too_many = len(self._records) > self.max_records
            too_old = now - oldest["recorded_at"] > self.ttl_seconds
            if not (too_many or too_old):
                return
            del self._records[oldest_id]
            self.evictions += 1
            rollout_id = oldest.get("rollout_id")
            if rollout_id and rollout_id in self._by_rollout:
                remaining = [i for i in self._by_rollout[rollout_id] if i != oldest_id]
                if remaining:
                    self._by_rollout[rollout_id] = remaining
                else:
                    del self._by_rollout[rollout_id]
