"""The Tinker API's training runs on disk, so that a restarted server still knows its paths.

`<--path>/tinker/runs.json` holds, per model id: the run's model in the store (project "tinker"),
its base model and LoRA settings, its session, when it was created and last used, its sampler
names with their steps, and what the REST calls set on its checkpoints (published ones, expiry
times); and, per session, its metadata and samplers. It is rewritten whole after each change (a
temporary file, then a rename), so a killed server leaves the file as it was before or after the
change, never half of it.

A restarted server reads it: a sampler path answers again (the run's model is registered once
more on first use and its checkpoints served), and `list_checkpoints` / `get_training_run` answer
for every run. Training does not resume in a run of before the restart: its optimizer state and
the steps after its last save lived in the old process; a training client starts again from a
saved state (`create_training_client_from_state`), which `_states` finds by its own file.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

logger = logging.getLogger("art_backend.tinker")

INDEX_FILE = "runs.json"
PROJECT = "tinker"  # the store's project of a run, unless its user_metadata names one


# A checkpoint's TTL: Tinker's bounds (the SDK's set_checkpoint_ttl_from_tinker_path docstring).
TTL_MIN_SECONDS = 3600
TTL_MAX_SECONDS = 10 * 365 * 24 * 3600


def now() -> str:
    """The time as the index keeps it (UTC, ISO 8601)."""
    return datetime.now(UTC).isoformat()


def check_ttl(ttl_seconds: int) -> int:
    """`ttl_seconds` within Tinker's bounds (a ValueError that says them otherwise)."""
    if not TTL_MIN_SECONDS <= ttl_seconds <= TTL_MAX_SECONDS:
        raise ValueError(
            f"ttl_seconds {ttl_seconds} is out of range: give {TTL_MIN_SECONDS} (an hour) to "
            f"{TTL_MAX_SECONDS} (10 years), or None to keep the checkpoint"
        )
    return ttl_seconds


def expiry(ttl_seconds: int, start: datetime | None = None) -> str:
    """When a checkpoint given `ttl_seconds` at `start` (now) expires, as the index keeps it."""
    return ((start or datetime.now(UTC)) + timedelta(seconds=ttl_seconds)).isoformat()


@dataclass
class RunRecord:
    """What the index keeps of one training run."""

    model_id: str
    store_name: str
    base_model: str
    lora: dict[str, Any]
    project: str = PROJECT
    created: str = field(default_factory=now)
    last_used: str = field(default_factory=now)
    samplers: dict[str, int] = field(default_factory=dict)  # sampler name -> step
    session_id: str | None = None
    public: list[str] = field(default_factory=list)  # checkpoint ids ("weights/<name>", ...)
    expires: dict[str, str] = field(default_factory=dict)  # checkpoint id -> UTC ISO time


@dataclass
class SessionRecord:
    """What the index keeps of one SDK session: its metadata and its sampling sessions (its
    training runs name it in their `RunRecord.session_id`)."""

    session_id: str
    user_metadata: dict[str, str] | None = None
    created: str = field(default_factory=now)
    sampler_ids: list[str] = field(default_factory=list)


class RunIndex:
    """The runs of `<art_path>/tinker/runs.json`, read at start and written after each change."""

    def __init__(self, art_path: Path):
        self.file = art_path / "tinker" / INDEX_FILE
        self.records: dict[str, RunRecord] = {}
        self.sessions: dict[str, SessionRecord] = {}
        self._read()

    def _read(self) -> None:
        if not self.file.is_file():
            return
        try:
            rows = json.loads(self.file.read_text())
            records = {row["model_id"]: RunRecord(**row) for row in rows["runs"]}
            # An index written before sessions were kept has none.
            sessions = [SessionRecord(**row) for row in rows.get("sessions", [])]
        except (ValueError, KeyError, TypeError) as error:
            # Only a hand or another program damages it (we write it whole): kept aside, not lost.
            aside = self.file.with_name(f"{INDEX_FILE}.damaged")
            os.replace(self.file, aside)
            logger.warning(
                "%s is damaged (%s); it is kept as %s and the Tinker runs before this start are "
                "not known by model id (their checkpoints stay in the store, project 'tinker').",
                self.file,
                error,
                aside,
            )
            return
        self.records = records
        self.sessions = {row.session_id: row for row in sessions}

    def put(self, record: RunRecord) -> None:
        """Keep `record` (new or changed), then write the file whole."""
        record.last_used = now()
        self.records[record.model_id] = record
        self.write()

    def put_session(self, session: SessionRecord) -> None:
        """Keep `session` (new or changed), then write the file whole."""
        self.sessions[session.session_id] = session
        self.write()

    def write(self) -> None:
        """The whole index into its file: a temporary file, then a rename."""
        self.file.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.file.with_name(f".tmp-{INDEX_FILE}-{os.getpid()}")
        runs = [asdict(row) for row in self.records.values()]
        sessions = [asdict(row) for row in self.sessions.values()]
        temporary.write_text(json.dumps({"runs": runs, "sessions": sessions}, indent=1))
        os.replace(temporary, self.file)
