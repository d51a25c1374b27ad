"""Recording each step so `art replay` can train it again (`_replay`): what `_model_registry` and
`_training_service` call while the server trains, and `saved_rows`, how a replay reads rows back.

  registration -> the environment (code version, packages, device, dtype, threads setting) and
  the base model's file hashes into `manifest.json` (`record_model`, `store._manifest`);
  each GRPO step -> its exact rows (`replay_inputs.safetensors`), the optimizer state it started
  from (`replay_start_state.pt`), its settings, thread count and client-side hashes, and the
  adapter hash after it (`replay.json`), inside the step's checkpoint, written with it
  (`StepInputs` around the step, `write_step_files` into the checkpoint, then `index_step`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import platform
import subprocess
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import ReplayInputMissingError
from art_backend.store._checkpoints import ModelStore
from art_backend.store._manifest import (
    START_STATE,
    STEP_INPUTS,
    folder_fingerprint,
    link_or_copy,
    read_manifest,
    read_step_record,
    record_registration,
    record_step,
    write_step_record,
)
from art_backend.training._grpo import LossConfig
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._rows import Rows
from art_backend.training._trainer import LoraTrainer
from art_backend.training._trainer_state import ADAPTER_WEIGHTS, TRAINER_STATE

PACKAGES = ("torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "numpy")
# Packages whose version changes the numbers of a step (the others only move files around).
NUMERIC_PACKAGES = ("torch", "transformers", "peft")
# Trajectory metadata a client may set for the manifest (one string, or a list of them).
CLIENT_KEYS = ("scenario_sha256", "data_sha256", "judge_cache_key")


# ------------------------------------------------------------------------------------ hashes


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over tensors by name: name, dtype, shape and raw bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}".encode() + b"\0")
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() + b"\0")
    return digest.hexdigest()


def adapter_sha256(path: Path) -> str:
    """`tensors_sha256` of an adapter file (its header metadata left out)."""
    from safetensors.torch import load_file

    return tensors_sha256(load_file(str(path)))


def rows_sha256(rows: Rows) -> str:
    """The hash of the exact rows a step trained on (every tensor and the trajectory ids); a
    Tinker datum's own targets and loss inputs count when a row has them (a GRPO row has not,
    so its hash is what it was before rows could carry them)."""
    tensors = {f.name: getattr(rows, f.name) for f in dataclasses.fields(rows)}
    ids = json.dumps(tensors.pop("trajectory_ids")).encode()
    if tensors.pop("target_ids") is not None:
        tensors["target_ids"] = rows.target_ids
    for name, values in tensors.pop("token_inputs").items():
        tensors[f"token_inputs.{name}"] = values
    return hashlib.sha256(tensors_sha256(tensors).encode() + ids).hexdigest()


# ------------------------------------------------------------------------------ saved inputs


def save_rows(rows: Rows, path: Path) -> None:
    """The rows without their padding: real tokens of every row end to end, and each length.

    Token ids as int32, masks as uint8: about 9 bytes per real token plus 12 per row.
    """
    from safetensors.torch import save_file

    real = rows.attention_mask.bool()
    save_file(
        {
            "lengths": rows.lengths.to(torch.int32),
            "input_ids": rows.input_ids[real].to(torch.int32),
            "trained_mask": rows.trained_mask[real].to(torch.uint8),
            "old_logprobs": rows.old_logprobs[real].contiguous(),
            "advantages": rows.advantages.contiguous(),
            "group_ids": rows.group_ids.to(torch.int32),
        },
        str(path),
        metadata={"trajectory_ids": json.dumps(rows.trajectory_ids), "format": "1"},
    )


def load_rows(path: Path) -> Rows:
    """The padded rows `save_rows` wrote, rebuilt as `pack_rows` builds them."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as source:
        saved = {name: source.get_tensor(name) for name in source.keys()}  # noqa: SIM118
        trajectory_ids = json.loads((source.metadata() or {})["trajectory_ids"])
    lengths = saved["lengths"].to(torch.long)
    shape = (len(lengths), int(lengths.max()) if len(lengths) else 0)
    real = torch.arange(shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    input_ids = torch.zeros(shape, dtype=torch.long)
    trained_mask = torch.zeros(shape, dtype=torch.bool)
    old_logprobs = torch.zeros(shape, dtype=torch.float32)
    input_ids[real] = saved["input_ids"].to(torch.long)
    trained_mask[real] = saved["trained_mask"].bool()
    old_logprobs[real] = saved["old_logprobs"]
    return Rows(
        input_ids=input_ids,
        attention_mask=real.to(torch.long),
        trained_mask=trained_mask,
        old_logprobs=old_logprobs,
        advantages=saved["advantages"],
        group_ids=saved["group_ids"].to(torch.long),
        trajectory_ids=trajectory_ids,
    )


def saved_rows(
    store: ModelStore, step: int, record: dict[str, Any], notes: list[str]
) -> tuple[Rows, bool]:
    """The rows step `step` trained on, read back for a replay, and whether they are the
    same as then (their hash in `record`); a note in `notes` where they are not."""
    path = store.checkpoint_dir(step) / STEP_INPUTS
    if not path.exists():
        raise ReplayInputMissingError(
            f"{path} is missing: the rows step {step} trained on are gone, so it cannot be "
            "replayed. Restore the file from a backup of the model folder."
        )
    rows = load_rows(path)
    ok = rows_sha256(rows) == record["inputs"]["sha256"]
    if not ok:
        notes.append(
            f"{STEP_INPUTS} of step {step} is not what the step trained on (its hash differs "
            "from replay.json's): the file changed after the step"
        )
    return rows, ok


# ------------------------------------------------------------------------------- environment


@functools.cache
def code_version() -> dict[str, Any]:
    """The installed art-trainer version and, for a git checkout, its commit and whether the
    tree differs from it (read-only git commands, once per process)."""
    root = Path(__file__).resolve().parents[3]
    version: dict[str, Any] = {"art_trainer": _version("art-trainer"), "git_commit": None}
    if (root / ".git").exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            git = ["git", "--no-optional-locks", "-C", str(root)]
            commit = subprocess.run(
                [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
            status = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            version.update(git_commit=commit or None, git_dirty=bool(status.strip()))
    return version


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    return {name: _version(name) for name in PACKAGES}


def host_model(host: Any) -> Any:
    """The model a trainer host (the torch engine) trains on."""
    return host.model


def environment(registry: Any) -> dict[str, Any]:
    """What the steps of this server run on: code, packages, device, dtype, threads setting."""
    model = host_model(registry.trainer_host)
    parameter = next(model.parameters())
    governor = getattr(registry.trainer_host, "threads", None)
    team = getattr(registry, "team", None)
    return {
        "code": code_version(),
        "packages": package_versions(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "device": parameter.device.type,
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "threads": "auto" if governor is not None else torch.get_num_threads(),
        "cuda": torch.version.cuda if parameter.device.type == "cuda" else None,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "engine": type(registry.engine).__name__,
        "train_processes": 1 if team is None else team.data_parallel.world_size,
    }


def record_model(registry: Any, model: Any, seed: int) -> None:
    """At registration: the model, its base model's file hashes and this server's environment."""
    previous = read_manifest(model.store) or {}
    source = getattr(host_model(registry.trainer_host), "name_or_path", None)
    cached = (previous.get("model") or {}).get("base_model_files")
    files = (
        folder_fingerprint(Path(source), cached)
        if source and Path(source).is_dir()
        else {"path": source, "sha256": None, "why": "not a local folder"}
    )
    description = {
        "project": model.store.project,
        "name": model.name,
        "base_model": model.base_model,
        "base_model_files": files,
        "lora": model.lora,
        "seed": seed,
    }
    record_registration(model.store, description, environment(registry))


# ----------------------------------------------------------------------------------- a step


@dataclass
class StepInputs:
    """What one GRPO step trains on and with, captured around `LoraTrainer.grpo_step`."""

    rows: Rows
    loss: LossConfig
    settings: OptimizerSettings
    beta: float
    config: dict[str, Any]
    client: dict[str, list[str]]
    threads: int
    from_step: int  # the checkpoint whose adapter and optimizer state the step starts from
    fresh_optimizer: bool
    governor: Any = None
    governor_changes: int = 0
    threads_changed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def before_step(
        cls,
        host: Any,
        trainer: LoraTrainer,
        rows: Rows,
        loss: LossConfig,
        settings: OptimizerSettings,
        request: Any,
        from_step: int,
    ) -> StepInputs:
        """Capture the step's inputs and the thread count it starts on (after the trainer holds
        checkpoint `from_step`)."""
        governor = getattr(host, "threads", None)
        return cls(
            rows=rows,
            loss=loss,
            settings=settings,
            beta=request.config.beta,
            config=request.config.model_dump(mode="json"),
            client=client_hashes(request),
            threads=governor.current() if governor is not None else torch.get_num_threads(),
            from_step=from_step,
            fresh_optimizer=not trainer.optimizer.state,
            governor=governor,
            governor_changes=governor.changes_total if governor is not None else 0,
        )

    def after_step(self) -> None:
        """Note whether the thread governor changed the count during the step."""
        if self.governor is not None:
            self.threads_changed = self.governor.changes_total != self.governor_changes


def client_hashes(request: Any) -> dict[str, list[str]]:
    """The scenario/data hashes and judge cache keys the client put in trajectory metadata."""
    found: dict[str, set[str]] = {key: set() for key in CLIENT_KEYS}
    for group in request.groups:
        for trajectory in group.trajectories:
            for key in CLIENT_KEYS:
                value = trajectory.metadata.get(key)
                values = value if isinstance(value, list) else [value]
                found[key].update(str(v) for v in values if isinstance(v, str | int))
    return {key: sorted(values) for key, values in found.items()}


def write_step_files(
    folder: Path,
    store: ModelStore,
    step: int,
    kind: str,
    inputs: StepInputs | None,
    metrics: dict[str, float],
) -> None:
    """Into step `step`'s temporary checkpoint folder, after the adapter: its record, and for a
    GRPO step the rows and the optimizer state it started from."""
    manifest = read_manifest(store) or {}
    record: dict[str, Any] = {
        "step": step,
        "kind": kind,
        "environment": manifest.get("current_environment"),
        "adapter_sha256": adapter_sha256(folder / ADAPTER_WEIGHTS),
        "recorded_at": time.time(),
        "trained": kind == "train" and inputs is not None,
    }
    if inputs is not None:
        save_rows(inputs.rows, folder / STEP_INPUTS)
        previous_state = store.checkpoint_dir(inputs.from_step) / TRAINER_STATE
        start_state: str | None = None
        if not inputs.fresh_optimizer and previous_state.is_file():
            link_or_copy(previous_state, folder / START_STATE)
            start_state = START_STATE
        record.update(
            config=inputs.config,
            loss=dataclasses.asdict(inputs.loss),
            optimizer=dataclasses.asdict(inputs.settings),
            beta=inputs.beta,
            threads=inputs.threads,
            threads_changed_during_step=inputs.threads_changed,
            client=inputs.client,
            inputs={
                "file": STEP_INPUTS,
                "sha256": rows_sha256(inputs.rows),
                "bytes": (folder / STEP_INPUTS).stat().st_size,
                "rows": inputs.rows.num_rows,
                "tokens": int(inputs.rows.attention_mask.sum()),
            },
            start={
                "from_step": inputs.from_step,
                "fresh_optimizer": inputs.fresh_optimizer,
                "optimizer_state": start_state,
            },
            metrics={"loss": metrics.get("loss"), "grad_norm": metrics.get("grad_norm")},
        )
    write_step_record(folder, record)


def index_step(store: ModelStore, step: int) -> None:
    """After step `step`'s checkpoint is in place: its summary into the manifest."""
    record = read_step_record(store, step)
    if record is not None:
        record_step(store, step, record)
