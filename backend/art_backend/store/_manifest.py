"""The run manifest of one model: what made each step, so that a step can be trained again.

Layout (beside the files `_checkpoints` draws):

    <project>/models/<name>/
        manifest.json                   the index: the model (base model, its files' hash, LoRA,
                                        seed), every environment that trained it (code version,
                                        package versions, the server's settings) and one summary
                                        per step (its environment, inputs hash, adapter hash)
        checkpoints/<step:04d>/
            replay.json                 the step's full record (config, loss, optimizer
                                        settings, threads, client-side hashes, both hashes)
            replay_inputs.safetensors   the exact token rows the step trained on
            replay_start_state.pt       the optimizer state the step started from (a hard link
                                        to the previous checkpoint's trainer_state.pt)

Crash protocol: the step's files are written inside its checkpoint's temporary folder, so they
appear with the checkpoint by the same rename, or not at all. `manifest.json` is rewritten
whole after each step and at each registration (written beside, flushed, renamed), so a crash
leaves the old index or the new one; an index that misses a step a crash cut off is completed
from the checkpoints' `replay.json` at the next registration (`add_missing_steps`).

Torch-free: the tensors' hashes are computed by the trainer's side
(`training._replay_record`); here live the files, the index and the base model's file hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from art_backend.store._checkpoints import ModelStore, inside

MANIFEST_FILE = "manifest.json"
STEP_RECORD = "replay.json"
STEP_INPUTS = "replay_inputs.safetensors"
START_STATE = "replay_start_state.pt"
MANIFEST_FORMAT = 1


def manifest_path(store: ModelStore) -> Path:
    return inside(store.root, store.project, "models", store.name, MANIFEST_FILE)


def read_manifest(store: ModelStore) -> dict[str, Any] | None:
    """The model's manifest, or None when none was written (a model trained before manifests)."""
    path = manifest_path(store)
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    return manifest if isinstance(manifest, dict) else None


def write_manifest(store: ModelStore, manifest: dict[str, Any]) -> None:
    """Replace `manifest.json` whole: written beside it, flushed, renamed."""
    path = manifest_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True, allow_nan=False)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def environment_id(environment: dict[str, Any]) -> str:
    """A short stable name for an environment: the hash of its canonical JSON."""
    return hashlib.sha256(json.dumps(environment, sort_keys=True).encode()).hexdigest()[:16]


def record_registration(
    store: ModelStore, model: dict[str, Any], environment: dict[str, Any]
) -> str:
    """Add this server's environment to the manifest (created if new); returns its id."""
    manifest = read_manifest(store) or {"format": MANIFEST_FORMAT, "steps": {}}
    manifest["model"] = model
    env_id = environment_id(environment)
    manifest.setdefault("environments", {})[env_id] = environment
    manifest["current_environment"] = env_id
    add_missing_steps(store, manifest)
    write_manifest(store, manifest)
    return env_id


def record_step(store: ModelStore, step: int, record: dict[str, Any]) -> None:
    """Add step `step`'s summary (its full record is the checkpoint's `replay.json`)."""
    manifest = read_manifest(store) or {"format": MANIFEST_FORMAT, "steps": {}}
    manifest.setdefault("steps", {})[str(step)] = step_summary(record)
    write_manifest(store, manifest)


def step_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What the manifest's index keeps of a step record."""
    inputs = record.get("inputs") or {}
    return {
        "kind": record.get("kind"),
        "environment": record.get("environment"),
        "adapter_sha256": record.get("adapter_sha256"),
        "inputs_sha256": inputs.get("sha256"),
        "threads": record.get("threads"),
    }


def add_missing_steps(store: ModelStore, manifest: dict[str, Any]) -> list[int]:
    """Index the steps whose checkpoint holds a record the manifest lacks (a crash between the
    checkpoint's rename and the manifest's rewrite); returns them."""
    steps = manifest.setdefault("steps", {})
    added = []
    for step in store.checkpoint_steps():
        record_file = store.checkpoint_dir(step) / STEP_RECORD
        if str(step) not in steps and record_file.is_file():
            steps[str(step)] = step_summary(json.loads(record_file.read_text()))
            added.append(step)
    return added


def read_step_record(store: ModelStore, step: int) -> dict[str, Any] | None:
    """The full record of step `step`, or None when its checkpoint holds none."""
    path = store.checkpoint_dir(step) / STEP_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def write_step_record(folder: Path, record: dict[str, Any]) -> None:
    """Write a step's record into its (temporary) checkpoint folder; the rename publishes it."""
    (folder / STEP_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link (no extra disk while both names exist), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        target.write_bytes(source.read_bytes())


# ---------------------------------------------------------------------------- base model files


_FOLDER_HASHES: dict[tuple[str, tuple[tuple[str, int, int], ...]], dict[str, Any]] = {}


def folder_fingerprint(folder: Path, cached: dict[str, Any] | None = None) -> dict[str, Any]:
    """sha256 of every file of a model folder (weights, tokenizer, configs), and of them all.

    Computed once per process per unchanged folder; `cached` (an earlier fingerprint, e.g. from
    the manifest) is reused when every file keeps its size and modification time.
    """
    files = sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )
    stats = tuple(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files
    )
    key = (str(folder), stats)
    if key in _FOLDER_HASHES:
        return _FOLDER_HASHES[key]
    if cached and cached.get("stats") == [list(s) for s in stats]:
        _FOLDER_HASHES[key] = cached
        return cached
    per_file = {}
    for path, (name, _, _) in zip(files, stats, strict=True):
        digest = hashlib.sha256()
        with open(path, "rb") as source:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
        per_file[name] = digest.hexdigest()
    total = hashlib.sha256(json.dumps(per_file, sort_keys=True).encode()).hexdigest()
    fingerprint = {
        "path": str(folder),
        "sha256": total,
        "files": per_file,
        "stats": [list(s) for s in stats],
    }
    _FOLDER_HASHES[key] = fingerprint
    return fingerprint
