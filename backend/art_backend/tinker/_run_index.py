"""The Tinker API's training runs on disk, so that a restarted server still knows its paths.

`<--path>/tinker/runs.json` holds, per model id: the run's model in the store (project "tinker"),
its base model and LoRA settings, when it was created and last used, and its sampler names with
their steps. It is rewritten whole after each change (a temporary file, then a rename), so a
killed server leaves the file as it was before or after the change, never half of it.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

logger = logging.getLogger("art_backend.tinker")

INDEX_FILE = "runs.json"
PROJECT = "tinker"  # the store's project of a run, unless its user_metadata names one


def now() -> str:
    """The time as the index keeps it (UTC, ISO 8601)."""
    return datetime.now(UTC).isoformat()


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


class RunIndex:
    """The runs of `<art_path>/tinker/runs.json`, read at start and written after each change."""

    def __init__(self, art_path: Path):
        self.file = art_path / "tinker" / INDEX_FILE
        self.records: dict[str, RunRecord] = self._read()

    def _read(self) -> dict[str, RunRecord]:
        if not self.file.is_file():
            return {}
        try:
            rows = json.loads(self.file.read_text())
            return {row["model_id"]: RunRecord(**row) for row in rows["runs"]}
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
            return {}

    def put(self, record: RunRecord) -> None:
        """Keep `record` (new or changed), then write the file whole."""
        record.last_used = now()
        self.records[record.model_id] = record
        self.file.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.file.with_name(f".tmp-{INDEX_FILE}-{os.getpid()}")
        runs = [asdict(row) for row in self.records.values()]
        temporary.write_text(json.dumps({"runs": runs}, indent=1))
        os.replace(temporary, self.file)
