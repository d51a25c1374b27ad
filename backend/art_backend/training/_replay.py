"""Replaying a recorded step: train step N again from what `_replay_record` saved, and check it.

Replaying step N (`replay_step`, `art replay`): the base model (hash checked) -> a trainer with
the model's LoRA settings and seed -> checkpoint N-1's adapter and the saved start state ->
`LoraTrainer.grpo_step` on the saved rows with the recorded settings and thread count -> the
adapter's hash against the manifest, and max |delta| per tensor against checkpoint N.

Every file is read and checked before the step trains (`_replay_files`): one that is gone or
damaged is a named error that says what to do. Bit-exact is expected on CPU with the same packages and the same thread count, held through the
step; otherwise the replay compares within `tolerance` (default: 1 % of the step's learning rate
per weight, about 1 % of one AdamW update) and says why (docs/reliability.md, "Replaying a step").
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import (
    BaseModelMismatchError,
    InvalidRequestError,
    ReplayInputMissingError,
    StoreNotFoundError,
)
from art_backend.engines._thread_settings import max_threads
from art_backend.store._checkpoints import ModelStore, check_name
from art_backend.store._manifest import folder_fingerprint, link_or_copy, manifest_path
from art_backend.training._replay_files import (
    RESTORE_MANIFEST,
    SavedStep,
    damaged_unless_read,
    read_saved_step,
)
from art_backend.training._replay_record import NUMERIC_PACKAGES, package_versions, tensors_sha256
from art_backend.training._trainer import LoraTrainer
from art_backend.training._trainer_state import ADAPTER_WEIGHTS, TRAINER_STATE

# Where bit-exact is not expected: max |delta| allowed, as a fraction of the step's learning
# rate (an AdamW update moves a weight by about the rate).
DEFAULT_RELATIVE_TOLERANCE = 0.01


# ------------------------------------------------------------------------------------- replay


@dataclass
class ReplayReport:
    """The outcome of one replay; `ok` decides the exit code."""

    project: str
    name: str
    step: int
    expected_sha256: str
    replayed_sha256: str
    inputs_ok: bool
    exact_expected: bool
    tolerance: float
    why_not_exact: list[str]
    max_delta: dict[str, float]
    notes: list[str]

    @property
    def bit_exact(self) -> bool:
        return self.inputs_ok and self.replayed_sha256 == self.expected_sha256

    @property
    def ok(self) -> bool:
        if self.bit_exact:
            return True
        worst = max(self.max_delta.values(), default=float("inf"))
        return (
            self.inputs_ok
            and not self.exact_expected
            and bool(self.max_delta)
            and worst <= self.tolerance
        )


def find_store(art_path: Path, name: str, project: str | None) -> ModelStore:
    """The model `name` under `art_path` (in `project`, or the one project that has it)."""
    check_name(name, "model name")
    projects = (
        [project]
        if project
        else sorted(p.parent.parent.name for p in art_path.glob(f"*/models/{name}") if p.is_dir())
    )
    if not projects or not (art_path / projects[0] / "models" / name).is_dir():
        raise StoreNotFoundError(
            f"No model {name!r} under {art_path}: pass the --path art-server used and a model "
            "name it trained (the folders are <path>/<project>/models/<name>)."
        )
    if len(projects) > 1:
        raise StoreNotFoundError(
            f"Model {name!r} exists in several projects under {art_path} ({', '.join(projects)}): "
            "pass --project."
        )
    return ModelStore(art_path, projects[0], name)


def replay_step(
    art_path: Path,
    name: str,
    step: int,
    *,
    project: str | None = None,
    threads: int | None = None,
    tolerance: float | None = None,
    base_model: Path | None = None,
    device: str | None = None,
) -> ReplayReport:
    """Train step `step` of model `name` again from its saved inputs; compare the adapter.

    Every file is read and checked first (`_replay_files`): a damaged one is a named error
    before any training."""
    if threads is not None and not 1 <= threads <= max_threads():
        raise InvalidRequestError(
            f"threads={threads}: give a count from 1 to {max_threads()} (4 per core, at least "
            "256), or None for the step's own count."
        )
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        # `worst <= nan` and `worst <= -1` are never true: every replay would be a mismatch.
        raise InvalidRequestError(
            f"tolerance={tolerance}: give a finite number of at least 0 (the largest |delta| per "
            "weight accepted), or None for 1 % of the step's learning rate."
        )
    store = find_store(art_path, name, project)
    notes: list[str] = []
    saved = read_saved_step(store, step, notes)
    manifest, record = saved.manifest, saved.record
    with damaged_unless_read(manifest_path(store), RESTORE_MANIFEST):
        folder = _base_model_folder(manifest, base_model)
        device = device or saved.environment.get("device", "cpu")
        threads = threads or int(record["threads"])
        why = _why_not_exact(saved.environment, record, manifest["model"]["lora"], threads, device)
    if tolerance is None:  # stated in the report: 0 where the same bits are expected
        tolerance = DEFAULT_RELATIVE_TOLERANCE * float(saved.optimizer.learning_rate)
        tolerance = tolerance if why else 0.0

    torch.set_num_threads(threads)
    replayed = _train_again(saved, folder, device)
    if saved.recorded_adapter is None:
        notes.append(f"checkpoint {step}'s adapter is gone: compared by hash only")
    return ReplayReport(
        project=store.project,
        name=name,
        step=step,
        expected_sha256=saved.expected_sha256,
        replayed_sha256=tensors_sha256(replayed),
        inputs_ok=saved.inputs_ok,
        exact_expected=not why,
        tolerance=tolerance,
        why_not_exact=why,
        max_delta=_max_deltas(replayed, saved.recorded_adapter or {}, notes),
        notes=notes,
    )


def _base_model_folder(manifest: dict[str, Any], override: Path | None) -> Path:
    files = manifest["model"]["base_model_files"]
    folder = override or (Path(files["path"]) if files.get("path") else None)
    if folder is None or not folder.is_dir():
        raise ReplayInputMissingError(
            f"The base model folder {files.get('path')!r} the run used is not here: pass "
            "--base-model with a folder holding the same files."
        )
    if files.get("sha256") and folder_fingerprint(folder)["sha256"] != files["sha256"]:
        raise BaseModelMismatchError(
            f"The files of {folder} differ from the base model the run trained on "
            f"(sha256 {files['sha256'][:12]}...): pass --base-model with the original files."
        )
    return folder


def _why_not_exact(
    env: dict[str, Any], record: dict[str, Any], lora: dict[str, Any], threads: int, device: str
) -> list[str]:
    """The reasons this replay cannot promise the same bits (empty: bit-exact is expected)."""
    why = []
    if device != "cpu":
        why.append(f"device {device}: GPU kernels may reduce in another order from run to run")
    if env.get("device", "cpu") != device:
        why.append(f"the step ran on {env.get('device')}, the replay on {device}")
    if record.get("threads") != threads:
        why.append(f"the step ran on {record.get('threads')} thread(s), the replay on {threads}")
    if record.get("threads_changed_during_step"):
        why.append("the thread governor changed the thread count during the step")
    here = package_versions()
    for package in NUMERIC_PACKAGES:
        then = env.get("packages", {}).get(package)
        if then != here.get(package):
            why.append(f"{package} {then} then, {here.get(package)} now")
    if float(lora.get("dropout", 0.0)) > 0:
        why.append(
            f"LoRA dropout {lora['dropout']}: its masks come from torch's global random state, "
            "which other work in the server may draw from between checkpoint and step"
        )
    if env.get("train_processes", 1) != 1:
        why.append(f"the step ran on {env['train_processes']} processes (gradients all-reduced)")
    return why


def _train_again(saved: SavedStep, base_folder: Path, device: str) -> dict[str, torch.Tensor]:
    """Checkpoint N-1's adapter plus the saved start state -> one GRPO step -> the adapter."""
    from safetensors.torch import load_file

    from art_backend.training._distributed import trainer_engine

    engine = trainer_engine(
        str(base_folder),
        dtype=saved.environment.get("dtype", "float32"),
        device=torch.device(device),
    )
    model_info = saved.manifest["model"]
    trainer = LoraTrainer(engine, "replay", model_info["lora"], seed=int(model_info["seed"]))
    with tempfile.TemporaryDirectory(prefix="art-replay-") as work:
        start_folder = Path(work) / "start"
        start_folder.mkdir()
        link_or_copy(saved.start_adapter, start_folder / ADAPTER_WEIGHTS)
        if saved.start_state is not None:
            link_or_copy(saved.start_state, start_folder / TRAINER_STATE)
        trainer.load(start_folder)
        trainer.grpo_step(saved.rows, saved.loss, saved.optimizer, beta=float(saved.record["beta"]))
        trainer.save(Path(work))
        return load_file(str(Path(work) / ADAPTER_WEIGHTS))


def _max_deltas(
    replayed: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], notes: list[str]
) -> dict[str, float]:
    """max |delta| per tensor between the replayed adapter and checkpoint N's ({} if gone)."""
    if saved and set(saved) != set(replayed):
        notes.append("the replayed adapter holds other tensors than the checkpoint's")
    return {
        name: float((replayed[name].double() - saved[name].double()).abs().max())
        for name in sorted(set(saved) & set(replayed))
    }
