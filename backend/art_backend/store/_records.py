"""Exact-token capture: every completion served is recorded under its id and its rollout id.

Eviction rule (memory stays bounded): a record is kept until (1) its rollout is discarded
(`discard_rollout`: a failed rollout), or (2) it is older than `ttl_seconds` (default 1
hour; checked on every read and write, so an expired record never lingers), or (3) the store
holds more than `max_records` completions (default 20,000) or more than `max_bytes` of records
(default 512 MiB, estimated when each is added). Under (3) the records a trainer may still need go last: first
the oldest records without a rollout id or already used by a train step (`release`), and only
when none is left the oldest records of rollouts not yet trained; so other requests, however
large, never evict a rollout waiting for its train step. A record larger than `max_bytes` alone
is not stored at all.
Every eviction by (2) or (3) is counted in `evictions` (those for bytes also in
`byte_evictions`) and shown on GET /metrics, and the store remembers why each recent record
went (`eviction_reason`), so a train step that asks for it says so in its drops.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from art_backend._errors import InvalidNameError
from art_core.names import is_rollout_id

# A typical record (a 1-2k-token prompt, a few hundred sampled tokens with logprobs) estimates
# at 50-150 KB, so 512 MiB keeps thousands: several training steps' worth of rollouts, while
# 20 requests carrying 20 MB of metadata each no longer add half a gigabyte.
DEFAULT_MAX_RECORD_BYTES = 512 * 1024 * 1024


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

    def __init__(
        self,
        *,
        max_records: int = 20_000,
        ttl_seconds: float = 3600.0,
        max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.max_records = max_records
        self.ttl_seconds = ttl_seconds
        self.max_bytes = max_bytes
        self.bytes = 0  # estimated size of the stored records (see `estimated_bytes`)
        self.evictions = 0
        self.byte_evictions = 0
        self.recorded = 0
        self.discarded = 0
        # Every record by id, in the order they came (oldest first); and in two queues: records a
        # trainer may still need (of a rollout, not yet used by a train step) and the rest, which
        # go first under the budget.
        self._records: dict[str, dict[str, Any]] = {}
        self._waiting: OrderedDict[str, None] = OrderedDict()
        self._spare: OrderedDict[str, None] = OrderedDict()
        self._evicted: OrderedDict[str, str] = OrderedDict()  # recent evictions: id -> why
        self._sizes: dict[str, int] = {}
        self._by_rollout: dict[str, list[str]] = {}
        self._discarded_rollouts: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        """Store one completion record (it must carry `id`, `recorded_at`, optional `rollout_id`)."""
        size = estimated_bytes(record)  # outside the lock: it walks the whole record
        with self._lock:
            self.recorded += 1
            if record.get("rollout_id") in self._discarded_rollouts:
                self.discarded += 1
                return
            if size > self.max_bytes:
                # Alone over the budget: storing it would evict every other record, then it.
                self.evictions += 1
                self.byte_evictions += 1
                return
            completion_id = record["id"]
            self._forget_locked(completion_id)  # a record stored again replaces the old one
            self._records[completion_id] = record
            self.bytes += size
            self._sizes[completion_id] = size
            if record.get("rollout_id"):
                self._by_rollout.setdefault(record["rollout_id"], []).append(completion_id)
                self._waiting[completion_id] = None
            else:
                self._spare[completion_id] = None
            self._evict_locked(time.time())

    def get(self, completion_id: str) -> dict[str, Any] | None:
        """The record of one completion, or None when unknown or evicted."""
        with self._lock:
            self._evict_locked(time.time())
            return self._records.get(completion_id)

    def get_many(self, completion_ids: list[str]) -> list[dict[str, Any]]:
        """The records of these completions that are still stored, in the order asked."""
        with self._lock:
            self._evict_locked(time.time())
            return [self._records[i] for i in completion_ids if i in self._records]

    def snapshot(self) -> list[dict[str, Any]]:
        """Every stored record, oldest first (the list is new; the records are shared)."""
        with self._lock:
            self._evict_locked(time.time())
            return sorted(self._records.values(), key=lambda record: record["recorded_at"])

    def rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        """The records of one rollout, oldest first."""
        with self._lock:
            self._evict_locked(time.time())
            ids = self._by_rollout.get(rollout_id, [])
            return [self._records[i] for i in ids if i in self._records]

    def release(self, completion_ids: list[str]) -> None:
        """A train step used these records: from now on they go first under the budget."""
        with self._lock:
            for completion_id in completion_ids:
                if self._waiting.pop(completion_id, False) is None:
                    self._spare[completion_id] = None

    def eviction_reason(self, completion_id: str) -> str | None:
        """Why a recent record is no longer stored (None: never stored here, or long ago)."""
        with self._lock:
            return self._evicted.get(completion_id)

    def discard_rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        """Forget a failed rollout's records, and any that arrive for it later (a request the
        client cancelled can still finish here): counted in `discarded`, not as evictions."""
        with self._lock:
            self._discarded_rollouts[rollout_id] = time.time()
            while len(self._discarded_rollouts) > self.max_records:
                self._discarded_rollouts.popitem(last=False)
            ids = self._by_rollout.pop(rollout_id, [])
            records = [self._forget_locked(i) for i in ids if i in self._records]
            self.discarded += len(records)
            return records

    def __len__(self) -> int:
        with self._lock:
            self._evict_locked(time.time())
            return len(self._records)

    def _forget_locked(self, completion_id: str) -> Any:
        """Remove one record from the indexes and the byte count; returns it (or None)."""
        self.bytes -= self._sizes.pop(completion_id, 0)
        self._waiting.pop(completion_id, None)
        self._spare.pop(completion_id, None)
        return self._records.pop(completion_id, None)

    def _evict_locked(self, now: float) -> None:
        while self._records:
            # The oldest of all (records are kept in the order they came) for the time limit;
            # under the budget, spare records go first.
            expired = next(iter(self._records))
            too_old = now - self._records[expired]["recorded_at"] > self.ttl_seconds
            oldest = [next(iter(queue)) for queue in (self._spare, self._waiting) if queue]
            too_many = len(self._records) > self.max_records
            too_big = self.bytes > self.max_bytes
            if too_old:
                victim, reason = expired, f"older than {self.ttl_seconds:g} s"
            elif too_many or too_big:
                victim = oldest[0]
                budget = (
                    f"{self.max_records:,} records" if too_many else f"{self.max_bytes:,} bytes"
                )
                reason = f"the record store was full ({budget})"
                if too_big and not too_many:
                    self.byte_evictions += 1
            else:
                return
            evicted = self._forget_locked(victim)
            self.evictions += 1
            self._evicted[victim] = reason
            while len(self._evicted) > self.max_records:
                self._evicted.popitem(last=False)
            rollout_id = evicted.get("rollout_id")
            if rollout_id and rollout_id in self._by_rollout:
                remaining = [i for i in self._by_rollout[rollout_id] if i != victim]
                if remaining:
                    self._by_rollout[rollout_id] = remaining
                else:
                    del self._by_rollout[rollout_id]


def estimated_bytes(value: Any) -> int:
    """Approximate memory held by a JSON-like value: `sys.getsizeof` of every object in it.

    Cheap (constant work per object, a long string costs no more than a short one) and close
    enough for a budget: shared small ints and interned strings are counted each time they occur.
    """
    return sum(sys.getsizeof(node) for node in json_nodes(value))


def json_nodes(value: Any) -> Iterator[Any]:
    """Every object in a JSON-like value, `value` included: dict keys and values, list items."""
    stack = [value]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
