"""Replayable runs: what each step is recorded with, and training step N again to check it.

Recording (hooks in `_registry` and `_service`):
  registration -> the environment (code version, packages, device, dtype, threads setting) and
  the base model's file hashes into `manifest.json` (`store._manifest`);
  each GRPO step -> its exact rows (`replay_inputs.safetensors`), the optimizer state it started
  from (`replay_start_state.pt`), its settings, thread count and client-side hashes, and the
  adapter hash after it (`replay.json`), inside the step's checkpoint, written with it.

Replaying step N (`replay_step`, `art replay`): the base model (hash checked) -> a trainer with
the model's LoRA settings and seed -> checkpoint N-1's adapter and the saved start state ->
`LoraTrainer.grpo_step` on the saved rows with the recorded settings and thread count -> the
adapter's hash against the manifest, and max |delta| per tensor against checkpoint N.

Bit-exact is expected on CPU with the same packages and the same thread count, held through the
step; otherwise the replay compares within `tolerance` (default: 1 % of the step's learning rate
per weight, about 1 % of one AdamW update) and says why (docs/reliability.md, "Replaying a step").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from art_backend.store._checkpoints import ModelStore, check_name
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
from art_backend.training._rows import Rows
from art_backend.training._trainer import (
    ADAPTER_WEIGHTS,
    TRAINER_STATE,
    LoraTrainer,
    OptimizerSettings,
)

PACKAGES = ("torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "numpy")
# Packages whose version changes the numbers of a step (the others only move files around).
NUMERIC_PACKAGES = ("torch", "transformers", "peft")
# Trajectory metadata a client may set for the manifest (one string, or a list of them).
CLIENT_KEYS = ("scenario_sha256", "data_sha256", "judge_cache_key")
# Where bit-exact is not expected: max |delta| allowed, as a fraction of the step's learning
# rate (an AdamW update moves a weight by about the rate).
DEFAULT_RELATIVE_TOLERANCE = 0.01


# ------------------------------------------------------------------------------------ errors


class ReplayError(Exception):
    """A step cannot be replayed; the message says what to do."""


class UnknownModelError(ReplayError):
    """No model of that name under --path."""


class UnknownStepError(ReplayError):
    """The model has no record of that step (not trained, not a GRPO step, or before manifests)."""


class ReplayInputMissingError(ReplayError):
    """A file the replay needs is gone (a deleted checkpoint, a removed input file)."""


class BaseModelMismatchError(ReplayError):
    """The base model's files are not those the step trained on."""


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
    """The hash of the exact rows a step trained on (every tensor and the trajectory ids)."""
    tensors = {f.name: getattr(rows, f.name) for f in dataclasses.fields(rows)}
    ids = json.dumps(tensors.pop("trajectory_ids")).encode()
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
        "train_processes": 1 if team is None else int(getattr(team, "world_size", 0) or 0),
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
        raise UnknownModelError(
            f"No model {name!r} under {art_path}: pass the --path art-server used and a model "
            "name it trained (the folders are <path>/<project>/models/<name>)."
        )
    if len(projects) > 1:
        raise UnknownModelError(
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
    """Train step `step` of model `name` again from its saved inputs; compare the adapter."""
    store = find_store(art_path, name, project)
    manifest = read_manifest(store)
    if manifest is None:
        raise UnknownStepError(
            f"{store.project}/{name} has no manifest.json: it was trained before runs were "
            "recorded. Only steps trained by a server that writes manifests can be replayed."
        )
    summary = manifest.get("steps", {}).get(str(step))
    record = read_step_record(store, step)
    if summary is None or record is None:
        known = sorted(int(s) for s, v in manifest.get("steps", {}).items() if v.get("kind"))
        raise UnknownStepError(
            f"{store.project}/{name} has no recorded step {step} (recorded: "
            f"{known or 'none'}); its checkpoint may have been deleted. Pick a recorded step."
        )
    if not record.get("trained"):
        raise UnknownStepError(
            f"Step {step} of {name} is a {record.get('kind')!r} step: replay covers GRPO train "
            "steps, whose exact rows are saved. Pick a train step."
        )
    notes: list[str] = []
    expected = summary["adapter_sha256"]
    if record.get("adapter_sha256") != expected:
        notes.append(
            f"the checkpoint's replay.json holds adapter hash {record.get('adapter_sha256')}, "
            f"the manifest {expected}: one of them changed after the step"
        )
    recorded_env = manifest.get("environments", {}).get(record.get("environment"), {})
    rows, inputs_ok = _saved_rows(store, step, record, notes)
    folder = _base_model_folder(manifest, base_model)
    device = device or recorded_env.get("device", "cpu")
    threads = threads or int(record["threads"])
    why = _why_not_exact(recorded_env, record, manifest["model"]["lora"], threads, device)
    if tolerance is None:  # stated in the report: 0 where the same bits are expected
        tolerance = DEFAULT_RELATIVE_TOLERANCE * float(record["optimizer"]["learning_rate"])
        tolerance = tolerance if why else 0.0

    torch.set_num_threads(threads)
    replayed = _train_again(store, manifest, record, rows, folder, device, recorded_env)
    after = store.checkpoint_dir(step) / ADAPTER_WEIGHTS
    max_delta = _max_deltas(replayed, after, notes) if after.is_file() else {}
    if not after.is_file():
        notes.append(f"checkpoint {step}'s adapter is gone: compared by hash only")
    return ReplayReport(
        project=store.project,
        name=name,
        step=step,
        expected_sha256=expected,
        replayed_sha256=tensors_sha256(replayed),
        inputs_ok=inputs_ok,
        exact_expected=not why,
        tolerance=tolerance,
        why_not_exact=why,
        max_delta=max_delta,
        notes=notes,
    )


def _saved_rows(
    store: ModelStore, step: int, record: dict[str, Any], notes: list[str]
) -> tuple[Rows, bool]:
    path = store.checkpoint_dir(step) / STEP_INPUTS
    if not path.is_file():
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


def _train_again(
    store: ModelStore,
    manifest: dict[str, Any],
    record: dict[str, Any],
    rows: Rows,
    base_folder: Path,
    device: str,
    env: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """Checkpoint N-1 plus the saved start state -> one GRPO step -> the adapter's tensors."""
    from art_backend.training._distributed import trainer_engine

    step = int(record["step"])
    start = record["start"]
    previous = store.checkpoint_dir(int(start["from_step"]))
    if not (previous / ADAPTER_WEIGHTS).is_file():
        raise ReplayInputMissingError(
            f"Checkpoint {start['from_step']} ({previous}) is gone: step {step} starts from its "
            "adapter. Replay a step whose previous checkpoint is kept."
        )
    state = store.checkpoint_dir(step) / START_STATE
    if not start["fresh_optimizer"] and (start["optimizer_state"] is None or not state.is_file()):
        raise ReplayInputMissingError(
            f"The optimizer state step {step} started from ({state}) is missing: without it "
            "AdamW's moments differ. Restore the file, or replay another step."
        )
    engine = trainer_engine(
        str(base_folder), dtype=env.get("dtype", "float32"), device=torch.device(device)
    )
    model_info = manifest["model"]
    trainer = LoraTrainer(engine, "replay", model_info["lora"], seed=int(model_info["seed"]))
    with tempfile.TemporaryDirectory(prefix="art-replay-") as work:
        start_folder = Path(work) / "start"
        start_folder.mkdir()
        link_or_copy(previous / ADAPTER_WEIGHTS, start_folder / ADAPTER_WEIGHTS)
        if not start["fresh_optimizer"]:
            link_or_copy(state, start_folder / TRAINER_STATE)
        trainer.load(start_folder)
        trainer.grpo_step(
            rows,
            LossConfig(**record["loss"]),
            OptimizerSettings(**record["optimizer"]),
            beta=float(record["beta"]),
        )
        trainer.save(Path(work))
        from safetensors.torch import load_file

        return load_file(str(Path(work) / ADAPTER_WEIGHTS))


def _max_deltas(
    replayed: dict[str, torch.Tensor], saved_path: Path, notes: list[str]
) -> dict[str, float]:
    from safetensors.torch import load_file

    saved = load_file(str(saved_path))
    if set(saved) != set(replayed):
        notes.append("the replayed adapter holds other tensors than the checkpoint's")
    return {
        name: float((replayed[name].double() - saved[name].double()).abs().max())
        for name in sorted(set(saved) & set(replayed))
    }
