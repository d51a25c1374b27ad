"""The Tinker API's checkpoints over REST: listings, weights info, delete, publish and TTL.

What the SDK's `RestClient` reads and changes (`list_checkpoints`, `list_user_checkpoints`,
`get_training_run`, `list_training_runs`, `get_weights_info_by_tinker_path`,
`delete_checkpoint(_from_tinker_path)`, `publish/unpublish_checkpoint_from_tinker_path`,
`set_checkpoint_ttl_from_tinker_path`), from the run index (`_run_index`) and the states on disk
(`_states`), so they answer for the runs of before a restart too. A run's checkpoints are its
saved states (`weights/<name>`, type "training") and its sampler weights
(`sampler_weights/<name>`, type "sampler", a step of its model in the store).

Semantics, after Tinker's own (https://tinker-docs.thinkingmachines.ai/ , "Saving and loading"
and the SDK's `RestClient` docstrings):

- delete: the checkpoint is gone from disk and from every listing; its path no longer loads or
  samples. A sampler's step that is its model's latest stays on disk as the run's current
  weights (the store trains and resumes from it), unnamed: no path reaches it. Samples in
  flight on a deleted sampler finish first (the delete answers after them); a sample or a load
  that was waiting for its turn fails as the user's, with a 404 that says it was deleted.
- publish / unpublish: marks the checkpoint public (`Checkpoint.public`). Publishing a public
  one, or unpublishing a private one, is refused: Tinker answers 409, but the SDK retries every
  409 for five minutes before it raises, so this server answers 400 (`BadRequestError`, at
  once). It has one API key, so every caller is the run's owner: publishing changes what the
  listings say, not who may read it.
- TTL: `ttl_seconds` from 1 hour to 10 years sets `expires_at` (now + ttl); None removes it.
  `save_state` and `save_weights_for_sampler` take a `ttl_seconds` too. An expired checkpoint
  is deleted when anything next lists, reads or changes checkpoints.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from art_backend._errors import InvalidRequestError, NotFoundError
from art_backend.store._checkpoints import ModelStore
from art_backend.tinker._run_index import RunRecord, check_ttl, expiry
from art_backend.tinker._sampling import SAMPLER_PATH
from art_backend.tinker._service import ATTENTION_MODULES, MLP_MODULES, TinkerTraining
from art_backend.tinker._states import TinkerStates
from art_core.wire import DeleteCheckpointsRequest

OWNER = "art-server"  # every run belongs to whoever holds this server's key
KINDS = {"weights": "training", "sampler_weights": "sampler"}  # path segment -> checkpoint type
HELD_STEP_POLL_SECONDS = 0.05


class TinkerCheckpoints:
    """Checkpoints over the run index and the saved states."""

    def __init__(self, training: TinkerTraining, states: TinkerStates):
        self.training = training
        self.states = states
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)  # TTLs count on it

    def record(self, model_id: str) -> RunRecord:
        """The run's record (404 when this server has no such run)."""
        record = self.training.index.records.get(model_id)
        if record is None:
            raise NotFoundError(f"No training run {model_id!r} on this server.")
        return record

    # -------------------------------------------------------------------------------- listings

    def checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        """The run's states and sampler weights, oldest first."""
        record = self.record(model_id)
        found = []
        prefix = f"tinker://{model_id}/weights/"
        for path, state in self.states.saved.items():
            if path.startswith(prefix):
                found.append(_checkpoint(record, path, state.folder))
        for name, step in record.samplers.items():
            folder = self._store(record).checkpoint_dir(step)
            if folder.is_dir():
                path = SAMPLER_PATH.format(model_id=model_id, name=name)
                found.append(_checkpoint(record, path, folder))
        return sorted(found, key=lambda checkpoint: checkpoint["time"])

    def user_checkpoints(self, limit: int, offset: int) -> dict[str, Any]:
        """The SDK's CheckpointsListResponse: every run's checkpoints, newest first."""
        every = [
            checkpoint
            for model_id in self.training.index.records
            for checkpoint in self.checkpoints(model_id)
        ]
        every.sort(key=lambda checkpoint: checkpoint["time"], reverse=True)
        return {
            "checkpoints": every[offset : offset + limit],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(every)},
        }

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

    def weights_info(self, tinker_path: str) -> dict[str, Any]:
        """The SDK's WeightsInfoResponse: what a client needs to load the checkpoint."""
        record, checkpoint_id = self.parse_path(tinker_path)
        self.existing(record, checkpoint_id)
        modules = set(record.lora.get("target_modules") or ())
        return {
            "base_model": record.base_model,
            "is_lora": True,
            "lora_rank": int(record.lora["r"]),
            "train_attn": bool(modules & set(ATTENTION_MODULES)),
            "train_mlp": bool(modules & set(MLP_MODULES)),
            "train_unembed": False,
        }

    # ------------------------------------------------------------------------ finding one

    def parse_path(self, tinker_path: str) -> tuple[RunRecord, str]:
        """`tinker://<model id>/<weights|sampler_weights>/<name>` as (run record, checkpoint id)."""
        parts = tinker_path.removeprefix("tinker://").split("/")
        if not tinker_path.startswith("tinker://") or len(parts) != 3 or parts[1] not in KINDS:
            raise InvalidRequestError(
                f"tinker_path {tinker_path!r} is not a checkpoint path "
                "(tinker://<model id>/weights/<name> or .../sampler_weights/<name>).",
                param="tinker_path",
            )
        return self.record(parts[0]), f"{parts[1]}/{parts[2]}"

    def existing(self, record: RunRecord, checkpoint_id: str) -> str:
        """The checkpoint's tinker path, once it is known to exist (404 otherwise)."""
        kind, _, name = checkpoint_id.partition("/")
        path = f"tinker://{record.model_id}/{checkpoint_id}"
        if kind not in KINDS or not name or "/" in name:
            raise InvalidRequestError(
                f"Checkpoint id {checkpoint_id!r} is not weights/<name> or sampler_weights/<name>.",
                param="checkpoint_id",
            )
        found = path in self.states.saved if kind == "weights" else name in record.samplers
        if not found:
            raise NotFoundError(
                f"Training run {record.model_id} has no checkpoint {checkpoint_id!r}; "
                "rest_client.list_checkpoints lists its checkpoints."
            )
        return path

    # ----------------------------------------------------------------------------- changes

    async def delete(self, model_id: str, checkpoint_id: str) -> None:
        """Delete the checkpoint from disk and from the listings."""
        record = self.record(model_id)
        path = self.existing(record, checkpoint_id)
        kind, _, name = checkpoint_id.partition("/")
        if kind == "weights":
            _remove_folder(self.states.saved.pop(path).folder)
        else:
            await self._delete_sampler_step(record, record.samplers.pop(name))
        record.public = [item for item in record.public if item != checkpoint_id]
        record.expires.pop(checkpoint_id, None)
        self.training.index.put(record)

    async def _delete_sampler_step(self, record: RunRecord, step: int) -> None:
        """The sampler's step off disk, unless it is what the run trains and serves from."""
        run = self.training.runs.get(record.model_id)
        if run is None:  # a run of before a restart, not registered again: the store alone
            store = self._store(record)
            if step != store.latest_step():
                store.delete_checkpoint(step)
            return
        model = run.registered
        if step in (model.step, model.promoted):
            return
        # A sample in flight holds its step (`_sampling`); the registry would keep a held step
        # on disk for good, so the delete waits for those samples (no new one starts: the
        # name is gone). Polled: a hold has no event to wait on, and samples are short.
        while model.holds.get(step):
            await asyncio.sleep(HELD_STEP_POLL_SECONDS)
        registry = self.training.training.registry
        await registry.delete_checkpoints(model, DeleteCheckpointsRequest(steps=[step]))

    def publish(self, model_id: str, checkpoint_id: str, public: bool) -> None:
        """Mark the checkpoint public (or private again); a 400 when it is so already."""
        record = self.record(model_id)
        self.existing(record, checkpoint_id)
        if (checkpoint_id in record.public) == public:
            state, undo = ("public", "unpublish") if public else ("private", "publish")
            raise InvalidRequestError(
                f"Checkpoint {checkpoint_id!r} of {model_id} is {state} already ({undo} it to "
                "change that).",
                param="tinker_path",
            )
        if public:
            record.public.append(checkpoint_id)
        else:
            record.public.remove(checkpoint_id)
        self.training.index.put(record)

    def set_ttl(self, model_id: str, checkpoint_id: str, ttl_seconds: int | None) -> None:
        """Expire the checkpoint `ttl_seconds` from now, or never (None)."""
        record = self.record(model_id)
        self.existing(record, checkpoint_id)
        if ttl_seconds is None:
            record.expires.pop(checkpoint_id, None)
        else:
            try:
                check_ttl(ttl_seconds)
            except ValueError as error:
                raise InvalidRequestError(f"{error}.", param="ttl_seconds") from None
            record.expires[checkpoint_id] = expiry(ttl_seconds, self.clock())
        self.training.index.put(record)

    async def expire_due(self) -> list[str]:
        """Delete every checkpoint whose TTL has run out; their paths."""
        now = self.clock()
        due = [
            (record.model_id, checkpoint_id)
            for record in list(self.training.index.records.values())
            for checkpoint_id, expires_at in list(record.expires.items())
            if datetime.fromisoformat(expires_at) <= now
        ]
        for model_id, checkpoint_id in due:
            record = self.record(model_id)
            try:
                await self.delete(model_id, checkpoint_id)
            except NotFoundError:  # gone some other way: its expiry goes too
                record.expires.pop(checkpoint_id, None)
                self.training.index.put(record)
        return [f"tinker://{model_id}/{checkpoint_id}" for model_id, checkpoint_id in due]

    def _store(self, record: RunRecord) -> ModelStore:
        return ModelStore(
            self.training.training.registry.art_path, record.project, record.store_name
        )


def _checkpoint(record: RunRecord, path: str, folder: Path) -> dict[str, Any]:
    """The SDK's Checkpoint for the folder that holds it."""
    files = [item for item in folder.rglob("*") if item.is_file()]
    checkpoint_id = path.removeprefix("tinker://").split("/", 1)[1]
    return {
        "checkpoint_id": checkpoint_id,
        "checkpoint_type": KINDS[checkpoint_id.split("/")[0]],
        "training_run_id": record.model_id,
        "time": datetime.fromtimestamp(folder.stat().st_mtime, UTC).isoformat(),
        "tinker_path": path,
        "size_bytes": sum(item.stat().st_size for item in files),
        "public": checkpoint_id in record.public,
        "expires_at": record.expires.get(checkpoint_id),
    }


def _remove_folder(folder: Path) -> None:
    """A state's folder, renamed aside first (a `.tmp-` name, which `found_states` removes at the
    next start), so a kill mid-removal never leaves half a state under its own name."""
    trash = folder.with_name(f".tmp-deleting-{folder.name}-{os.getpid()}")
    os.rename(folder, trash)
    shutil.rmtree(trash)
