"""The on-disk store of one trained model: checkpoints, history, logged trajectories.

Layout under the server's `--path` (default `.art`):

    <project>/models/<name>/
        model.json                      base model and LoRA settings, written at registration
        checkpoints/<step:04d>/         adapter_model.safetensors, adapter_config.json,
                                        trainer_state.pt (optimizer, scheduler, RNG), step.json
        history.jsonl                   one JSON row per train step and per log call
        trajectories/<split>/<step:04d>.jsonl.gz

Crash safety: a checkpoint is written into `checkpoints/.tmp-<step>-<pid>/`, flushed to disk and
renamed into place, so a folder named `<step:04d>` is always complete. History rows are appended
with one write each; a torn last line (a crash mid-write) is ignored on read and repaired, and a
train row missing after a crash between the rename and the append is rebuilt from the
checkpoint's own `step.json`.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEP_FILE = "step.json"
TMP_PREFIX = ".tmp-"
# Fault injection for the crash tests: `ART_FAULT_PAUSE=<point>:<seconds>` sleeps at that point so
# a test can SIGKILL the process there. Points: before_checkpoint, before_rename, before_history.
FAULT_ENV = "ART_FAULT_PAUSE"


def fault_point(name: str) -> None:
    """Sleep here if the crash tests asked for it (no effect otherwise)."""
    point, _, seconds = os.environ.get(FAULT_ENV, "").partition(":")
    if point == name:
        time.sleep(float(seconds or 60))


class ModelStore:
    """Paths and crash-safe writes for `<root>/<project>/models/<name>/`."""

    def __init__(self, root: Path, project: str, name: str) -> None:
        self.root = root
        self.project = project
        self.name = name
        self.dir = root / project / "models" / name
        self.checkpoints_dir = self.dir / "checkpoints"
        self.history_path = self.dir / "history.jsonl"

    # ------------------------------------------------------------------------------ checkpoints

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints_dir / f"{step:04d}"

    def checkpoint_steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending (temporary folders are not checkpoints)."""
        if not self.checkpoints_dir.is_dir():
            return []
        return sorted(
            int(path.name)
            for path in self.checkpoints_dir.iterdir()
            if path.name.isdigit() and (path / STEP_FILE).is_file()
        )

    def latest_step(self) -> int | None:
        steps = self.checkpoint_steps()
        return steps[-1] if steps else None

    def write_checkpoint(
        self, step: int, write_files: Callable[[Path], None], state: dict[str, Any]
    ) -> Path:
        """Write a checkpoint atomically: `write_files(tmp)` fills a temporary folder, then rename.

        `state` (step, metrics, time) goes into `step.json`, written last: its presence marks the
        folder complete even if a file system reorders the rename.
        """
        self.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoints_dir / f"{TMP_PREFIX}{step:04d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        fault_point("before_checkpoint")
        write_files(tmp)
        _write_json_synced(tmp / STEP_FILE, {"step": step, **state})
        for path in tmp.iterdir():
            _fsync_path(path)
        fault_point("before_rename")
        final = self.checkpoint_dir(step)
        if final.exists():  # a re-run of a step that was rolled back: replace it whole
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_path(self.checkpoints_dir)
        return final

    def read_step_state(self, step: int) -> dict[str, Any]:
        return json.loads((self.checkpoint_dir(step) / STEP_FILE).read_text())

    def remove_stale_temporaries(self) -> int:
        """Delete temporary folders left by a crash; returns how many were removed."""
        if not self.checkpoints_dir.is_dir():
            return 0
        stale = [p for p in self.checkpoints_dir.iterdir() if p.name.startswith(TMP_PREFIX)]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return len(stale)

    def prune_file(self, filename: str, *, keep_step: int) -> None:
        """Remove `filename` from every checkpoint but `keep_step` (resume needs only the latest)."""
        for step in self.checkpoint_steps():
            if step != keep_step:
                (self.checkpoint_dir(step) / filename).unlink(missing_ok=True)

    def delete_checkpoint(self, step: int) -> None:
        shutil.rmtree(self.checkpoint_dir(step))

    # ---------------------------------------------------------------------------------- history

    def append_history(self, row: dict[str, Any]) -> None:
        """Append one row; a single write call so a crash leaves at most a torn last line."""
        self.dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"recorded_at": time.time(), **row}, allow_nan=False) + "\n"
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_history(self) -> list[dict[str, Any]]:
        """All complete rows; a torn last line is skipped."""
        if not self.history_path.is_file():
            return []
        rows = []
        for line in self.history_path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows

    def repair_history(self) -> list[str]:
        """Make history agree with the checkpoints after a crash; returns what was repaired."""
        repairs: list[str] = []
        if self.history_path.is_file():
            text = self.history_path.read_text()
            if text and not text.endswith("\n"):
                kept = text[: text.rfind("\n") + 1]
                self.history_path.write_text(kept)
                repairs.append("dropped a torn last line of history.jsonl")
        rows = self.read_history()
        # Train rows for steps whose checkpoint no longer exists (rolled back) stay: they happened.
        trained_steps = {row["step"] for row in rows if row.get("type") in ("train", "sft")}
        for step in self.checkpoint_steps():
            if step == 0 or step in trained_steps:
                continue
            state = self.read_step_state(step)
            if state.get("kind") in ("train", "sft"):
                self.append_history(
                    {"type": state["kind"], "step": step, "metrics": state.get("metrics", {})}
                )
                repairs.append(f"rebuilt the history row of step {step} from its checkpoint")
        return repairs

    # ----------------------------------------------------------------------------- trajectories

    def write_trajectories(self, split: str, step: int, rows: list[dict[str, Any]]) -> Path:
        """Append trajectories (one JSON object each) to `trajectories/<split>/<step>.jsonl.gz`."""
        folder = self.dir / "trajectories" / split
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{step:04d}.jsonl.gz"
        # gzip members concatenate: appending a member keeps earlier logs of the same step.
        with gzip.open(path, "at", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, default=str) + "\n")
        return path

    # ----------------------------------------------------------------------------------- config

    def write_model_config(self, config: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json_synced(self.dir / "model.json", config)

    def read_model_config(self) -> dict[str, Any] | None:
        path = self.dir / "model.json"
        return json.loads(path.read_text()) if path.is_file() else None


def read_trajectories(path: Path) -> list[dict[str, Any]]:
    """The rows of a `trajectories/<split>/<step>.jsonl.gz` file."""
    with gzip.open(path, "rt", encoding="utf-8") as source:
        return [json.loads(line) for line in source if line.strip()]


def _write_json_synced(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as out:
        json.dump(value, out, indent=2, allow_nan=False)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _fsync_path(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
