"""Reading what `art replay` needs (`_replay`), every file checked before the step trains again.

    <project>/models/<name>/manifest.json          the model, its environments, each step's hash
    checkpoints/<N>/replay.json                    the step's settings, threads, inputs' hash
    checkpoints/<N>/replay_inputs.safetensors      the rows it trained on
    checkpoints/<N-1>/adapter_model.safetensors    the adapter it started from
    checkpoints/<N>/replay_start_state.pt          the optimizer state it started from
    checkpoints/<N>/adapter_model.safetensors      the adapter it wrote (compared at the end)

A file that is gone raises `ReplayInputMissingError`; one that cannot be read or used (cut short,
garbled, a folder, a field missing or out of range) raises `StoreFileDamagedError`. Both name
the file and say what to do, so `art replay` ends with one line and exit code 2, not a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import (
    BackendError,
    InvalidRequestError,
    ReplayInputMissingError,
    StoreFileDamagedError,
    StoreNotFoundError,
    TrainerStateError,
)
from art_backend.engines._thread_settings import max_threads
from art_backend.store._checkpoints import ModelStore
from art_backend.store._manifest import (
    START_STATE,
    STEP_INPUTS,
    STEP_RECORD,
    manifest_path,
    read_manifest,
    read_step_record,
)
from art_backend.training._grpo import LossConfig
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._replay_record import saved_rows
from art_backend.training._rows import Rows
from art_backend.training._trainer_state import ADAPTER_WEIGHTS, read_trainer_state

RESTORE_MANIFEST = "restore it from a backup of the model folder"
RESTORE = f"{RESTORE_MANIFEST}, or replay another step"


@dataclass
class SavedStep:
    """A recorded step's files, read and checked: what a replay trains on and compares with."""

    manifest: dict[str, Any]
    record: dict[str, Any]
    environment: dict[str, Any]  # the recorded environment the step ran in
    expected_sha256: str  # the adapter hash the manifest holds for the step
    rows: Rows
    inputs_ok: bool  # the rows hash as replay.json says
    loss: LossConfig
    optimizer: OptimizerSettings
    start_adapter: Path  # checkpoint N-1's adapter
    start_state: Path | None  # None: the step started with a fresh optimizer
    recorded_adapter: dict[str, torch.Tensor] | None  # checkpoint N's; None when it is gone


@contextlib.contextmanager
def damaged_unless_read(path: Path, what_to_do: str) -> Iterator[None]:
    """Any failure to read or use `path` inside the block becomes a `StoreFileDamagedError`
    naming the file, the failure and `what_to_do`; the backend's named errors pass, except
    the trainer's own verdict on a state file, whose advice (delete it) does not fit here."""
    try:
        yield
    except TrainerStateError as error:
        # Its cause, if kept; a refused pickle's is dropped on purpose (it advises unpickling).
        reason = _one_line(error.__cause__) if error.__cause__ else "not plain tensors and numbers"
        raise _damaged(path, reason, what_to_do) from error
    except BackendError:
        raise
    except Exception as error:
        raise _damaged(path, _one_line(error), what_to_do) from error


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:200]


def _damaged(path: Path, reason: str, what_to_do: str) -> StoreFileDamagedError:
    if path.is_dir():
        reason = "it is a folder, not a file"
    return StoreFileDamagedError(
        f"{path} cannot be used to replay the step ({reason}): {what_to_do}."
    )


def read_saved_step(store: ModelStore, step: int, notes: list[str]) -> SavedStep:
    """Step `step`'s files, each checked; `notes` gains what the verdict should mention."""
    manifest, summary = _manifest_and_summary(store, step)
    record_file = store.checkpoint_dir(step) / STEP_RECORD
    with damaged_unless_read(record_file, RESTORE):
        if record_file.is_dir():
            raise IsADirectoryError(record_file)
        record = read_step_record(store, step)
        if record is not None and not isinstance(record, dict):
            raise TypeError(f"it holds a JSON {type(record).__name__}, not an object")
    if summary is None or record is None:
        steps = manifest["steps"].items()
        known = sorted(int(s) for s, v in steps if s.isdigit() and isinstance(v, dict))
        raise StoreNotFoundError(
            f"{store.project}/{store.name} has no recorded step {step} (recorded: "
            f"{known or 'none'}); its checkpoint may have been deleted. Pick a recorded step."
        )
    if not record.get("trained"):
        raise StoreNotFoundError(
            f"Step {step} of {store.name} is a {record.get('kind')!r} step: replay covers GRPO "
            "train steps, whose exact rows are saved. Pick a train step."
        )
    with damaged_unless_read(record_file, RESTORE):
        loss = _numbers_checked(LossConfig, record["loss"], "loss")
        optimizer = _numbers_checked(OptimizerSettings, record["optimizer"], "optimizer")
        _require(record["beta"], float | int, "beta")
        _require(record["inputs"]["sha256"], str, "inputs.sha256")
        start = _require(record["start"], dict, "start")
        from_step = _require(start["from_step"], int, "start.from_step")
        fresh = _require(start["fresh_optimizer"], bool, "start.fresh_optimizer")
        threads = _require(record["threads"], int, "threads")
        if not 1 <= threads <= max_threads():
            raise ValueError(f"threads {threads} is not a count from 1 to {max_threads()}")
    expected = summary["adapter_sha256"]
    if record.get("adapter_sha256") != expected:
        notes.append(
            f"the checkpoint's replay.json holds adapter hash {record.get('adapter_sha256')}, "
            f"the manifest {expected}: one of them changed after the step"
        )
    with damaged_unless_read(store.checkpoint_dir(step) / STEP_INPUTS, RESTORE):
        rows, inputs_ok = saved_rows(store, step, record, notes)
    with damaged_unless_read(manifest_path(store), RESTORE_MANIFEST):
        environments = manifest.get("environments", {})
        environment = environments.get(record.get("environment"), {})
        if not isinstance(environment, dict):
            raise TypeError(f"environment {record.get('environment')!r} is not an object")
    return SavedStep(
        manifest=manifest,
        record=record,
        environment=environment,
        expected_sha256=expected,
        rows=rows,
        inputs_ok=inputs_ok,
        loss=loss,
        optimizer=optimizer,
        start_adapter=_start_adapter(store, step, from_step),
        start_state=None if fresh else _start_state(store, step, start),
        recorded_adapter=_recorded_adapter(store, step),
    )


def _manifest_and_summary(
    store: ModelStore, step: int
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The manifest, checked for the fields a replay reads, and step `step`'s summary in it."""
    path = manifest_path(store)
    with damaged_unless_read(path, RESTORE_MANIFEST):
        manifest = read_manifest(store)
        if manifest is None and path.exists():
            raise TypeError("it holds JSON that is not an object")
        if manifest is None:
            raise StoreNotFoundError(
                f"{store.project}/{store.name} has no manifest.json: it was trained before runs "
                "were recorded. Only steps trained by a server that writes manifests can be "
                "replayed."
            )
        model = _require(manifest["model"], dict, "model")
        _require(model["lora"], dict, "model.lora")
        _require(model["seed"], int, "model.seed")
        _require(model["base_model_files"], dict, "model.base_model_files")
        summary = manifest["steps"].get(str(step))
        if summary is not None:
            _require(summary["adapter_sha256"], str, f"steps.{step}.adapter_sha256")
    return manifest, summary


def _numbers_checked(kind: Any, values: dict[str, Any], name: str) -> Any:
    """`kind(**values)` (a dataclass), when each field declared a float or an int holds a
    number; settings that refuse their own values (`OptimizerSettings`) say why, as here."""
    for field in dataclasses.fields(kind):
        value = values.get(field.name, 0)
        if field.type in ("float", "int") and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            raise TypeError(f"{name}.{field.name} is {value!r}, not a number")
    try:
        return kind(**values)
    except InvalidRequestError as error:  # not the request's fault: the file's
        raise ValueError(f"{name}.{error.message}") from None


def _require(value: Any, kind: Any, name: str) -> Any:
    """`value`, when it is a `kind`; else a TypeError naming the field."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} is {value!r}, not {getattr(kind, '__name__', kind)}")
    return value


def _start_adapter(store: ModelStore, step: int, from_step: int) -> Path:
    """Checkpoint `from_step`'s adapter, which step `step` started from, checked readable."""
    from safetensors.torch import load_file

    path = store.checkpoint_dir(from_step) / ADAPTER_WEIGHTS
    if not path.exists():
        raise ReplayInputMissingError(
            f"Checkpoint {from_step} ({path.parent}) is gone: step {step} starts from its "
            "adapter. Replay a step whose previous checkpoint is kept."
        )
    with damaged_unless_read(path, f"step {step} starts from it: {RESTORE}"):
        load_file(str(path))
    return path


def _start_state(store: ModelStore, step: int, start: dict[str, Any]) -> Path:
    """The optimizer state step `step` started from, checked loadable."""
    path = store.checkpoint_dir(step) / START_STATE
    if start.get("optimizer_state") is None or not path.exists():
        raise ReplayInputMissingError(
            f"The optimizer state step {step} started from ({path}) is missing: without it "
            "AdamW's moments differ. Restore the file, or replay another step."
        )
    with damaged_unless_read(path, f"without it AdamW's moments differ: {RESTORE}"):
        read_trainer_state(path)
    return path


def _recorded_adapter(store: ModelStore, step: int) -> dict[str, torch.Tensor] | None:
    """Checkpoint `step`'s adapter, compared with the replayed one; None when it is gone."""
    from safetensors.torch import load_file

    path = store.checkpoint_dir(step) / ADAPTER_WEIGHTS
    if not path.exists():
        return None
    what_to_do = (
        "the replay compares its result with this adapter: restore it from a backup of the "
        "model folder, or move it away to compare by the manifest's hash only"
    )
    with damaged_unless_read(path, what_to_do):
        return load_file(str(path))
