"""The Tinker API's listings: a run's checkpoints, a training run, the training runs.

What the SDK's `RestClient` reads (`list_checkpoints`, `get_training_run`, `list_training_runs`),
from the run index (`_run_index`) and the states on disk (`_states`), so they answer for the runs
of before a restart too. A run's checkpoints are its saved states (`weights/<name>`, type
"training") and its sampler weights (`sampler_weights/<name>`, type "sampler", a step of its model
in the store: one deleted through our own API is no longer listed).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from art_backend._errors import NotFoundError
from art_backend.store._checkpoints import ModelStore
from art_backend.tinker._run_index import RunRecord
from art_backend.tinker._sampling import SAMPLER_PATH
from art_backend.tinker._service import TinkerTraining
from art_backend.tinker._states import TinkerStates

OWNER = "art-server"  # every run belongs to whoever holds this server's key


class TinkerCheckpoints:
    """Listings over the run index and the saved states."""

    def __init__(self, training: TinkerTraining, states: TinkerStates):
        self.training = training
        self.states = states

    def record(self, model_id: str) -> RunRecord:
        record = self.training.index.records.get(model_id)
        if record is None:
            raise NotFoundError(f"No training run {model_id!r} on this server.")
        return record

    def checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        """The run's states and sampler weights, oldest first."""
        record = self.record(model_id)
        found = []
        prefix = f"tinker://{model_id}/weights/"
        for path, state in self.states.saved.items():
            if path.startswith(prefix):
                found.append(_checkpoint(path, "training", state.folder))
        art_path = self.training.training.registry.art_path
        store = ModelStore(art_path, record.project, record.store_name)
        for name, step in record.samplers.items():
            folder = store.checkpoint_dir(step)
            if folder.is_dir():
                path = SAMPLER_PATH.format(model_id=model_id, name=name)
                found.append(_checkpoint(path, "sampler", folder))
        return sorted(found, key=lambda checkpoint: checkpoint["time"])

    def training_run(self, model_id: str) -> dict[str, Any]:
        """The SDK's TrainingRun: the run, its newest state and its newest sampler weights."""
        record = self.record(model_id)
        checkpoints = self.checkpoints(model_id)
        newest: dict[str, dict[str, Any] | None] = {"training": None, "sampler": None}
        for checkpoint in checkpoints:
            newest[checkpoint["checkpoint_type"]] = checkpoint
        return {
            "training_run_id": model_id,
            "base_model": record.base_model,
            "model_owner": OWNER,
            "is_lora": True,
            "corrupted": False,
            "lora_rank": int(record.lora["r"]),
            "last_request_time": record.last_used,
            "last_checkpoint": newest["training"],
            "last_sampler_checkpoint": newest["sampler"],
        }

    def training_runs(self, limit: int, offset: int) -> dict[str, Any]:
        """The SDK's TrainingRunsResponse: runs newest first, `limit` of them from `offset`."""
        records = sorted(
            self.training.index.records.values(), key=lambda row: row.created, reverse=True
        )
        page = records[offset : offset + limit]
        return {
            "training_runs": [self.training_run(record.model_id) for record in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(records)},
        }


def _checkpoint(path: str, kind: str, folder: Path) -> dict[str, Any]:
    """The SDK's Checkpoint for the folder that holds it."""
    files = [item for item in folder.rglob("*") if item.is_file()]
    return {
        "checkpoint_id": path.removeprefix("tinker://").split("/", 1)[1],
        "checkpoint_type": kind,
        "time": datetime.fromtimestamp(folder.stat().st_mtime, UTC).isoformat(),
        "tinker_path": path,
        "size_bytes": sum(item.stat().st_size for item in files),
        "public": False,
    }
