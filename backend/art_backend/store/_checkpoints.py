"""The on-disk store of one trained model: checkpoints, history, logged trajectories.

Layout under the server's `--path` (default `.art`):

    <project>/models/<name>/
        model.json                      base model and LoRA settings, written at registration
        checkpoints/<step:04d>/         adapter_model.safetensors, adapter_config.json, step.json;
                                        the newest and the promoted also trainer_state.pt
                                        (optimizer, RNG); the newest trajectories.jsonl.gz
                                        (what it trained on); replay.json, and for a GRPO step
                                        replay_inputs.safetensors and replay_start_state.pt
                                        (the previous trainer_state.pt, hard-linked): what
                                        `art replay` reads, drawn in `_manifest`
        manifest.json                   the run's index for `art replay` (`_manifest`)
        history.jsonl                   one JSON row per train step and per log call
        trajectories/<split>/<step:04d>.jsonl.gz

Confinement: project, model and split names pass the one name rule (`art_core.names`), and
every path the store builds must resolve, symlinks followed, inside the root (`inside`): a name or a link cannot lead the server to read or copy files elsewhere.

Crash safety: a checkpoint is written into `checkpoints/.tmp-<step>-<pid>/`, flushed to disk and
renamed into place, so a folder named `<step:04d>` is always complete. A checkpoint is deleted the
other way round: renamed to `checkpoints/.tmp-deleting-<step>-<pid>/`, then removed, so a crash
mid-delete leaves a temporary folder, never a half-deleted step; every `.tmp-` folder is removed
at the next registration (`remove_stale_temporaries`), and at the server's start those of every
model whose writer (the `<pid>` in the name) is no longer running (`_crash_leftovers`): a model
killed in its first checkpoint (a Tinker `create_model`) is never registered again, and a live
writer is another server on the same folder, mid-write. History rows are appended with one write
each; a torn last line (a crash mid-write) is ignored on read and repaired, and a train row
missing after a crash between the rename and the append is rebuilt from the checkpoint's own
`step.json` (and its trajectories from the checkpoint's copy, unless they were logged already).
A trajectories file is replaced whole on every write (its old bytes plus one new gzip member,
written to `.tmp-<file>-<pid>` and renamed), so a crash loses at most the batch being written.
Files written by older versions (appended in place) may hold a torn gzip member: the reader skips
it and resyncs at the next member, and `repair_trajectories` rewrites such a file from what is
readable, keeping the original beside it as `.damaged`. No repair rewrites a file in place: each
writes `.tmp-<file>-<pid>`, flushes it and renames it over the file, so a crash mid-repair leaves
the original whole; the next repair removes such a leftover.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import shutil
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_backend._errors import InvalidNameError, StoreFileDamagedError, UnsafePathError
from art_core.names import is_name, is_split

STEP_FILE = "step.json"
# A train checkpoint's own copy of the trajectories it trained on, kept in the newest step only:
# written atomically with the checkpoint, it restores them if a crash came before the log.
STEP_TRAJECTORIES = "trajectories.jsonl.gz"
MODEL_CONFIG_FILE = "model.json"
TMP_PREFIX = ".tmp-"
TRAJECTORY_FILE_PATTERN = re.compile(r"^([0-9]{4,9})\.jsonl\.gz$")
DAMAGED_SUFFIX = ".damaged"
GZIP_MAGIC = b"\x1f\x8b\x08"  # the start of every gzip member (magic bytes, then deflate)
# Fault injection for the crash tests: `ART_FAULT_PAUSE=<point>:<seconds>` sleeps at that point so
# a test can SIGKILL the process there. Points: before_checkpoint, before_rename,
# before_trajectories, before_history, before_trajectories_rename, before_checkpoint_removal.
FAULT_ENV = "ART_FAULT_PAUSE"
# History is read in blocks of whole lines this long: reading, splitting and decoding a long file
# in one call holds the interpreter (every other thread, the event loop's too) that long.
HISTORY_BLOCK_BYTES = 1024 * 1024


def fault_point(name: str) -> None:
    """Sleep here if the crash tests asked for it (no effect otherwise)."""
    point, _, seconds = os.environ.get(FAULT_ENV, "").partition(":")
    if point == name:
        print(f"fault point {name} reached", file=sys.stderr, flush=True)  # the test waits on it
        time.sleep(float(seconds or 60))


def inside(root: Path, *parts: str) -> Path:
    """`root / parts...`, refused unless it resolves (symlinks followed) inside `root`."""
    base = root.resolve()
    path = root.joinpath(*parts)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as error:  # a loop of symbolic links
        raise StoreFileDamagedError(
            f"{path} cannot be resolved ({getattr(error, 'strerror', None) or error}): remove "
            "or replace the symbolic link there."
        ) from error
    if not resolved.is_relative_to(base):
        raise UnsafePathError(
            f"{'/'.join(parts)} leads outside the server's --path {root} (a symbolic link?): "
            "only files inside it are read. Copy the files there instead of linking them."
        )
    return path


def check_name(value: str, what: str) -> str:
    """`value` if it passes the name rule of projects and models, else InvalidNameError."""
    if not is_name(value):
        raise InvalidNameError(
            f"Invalid {what} {value!r}: use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    return value


class ModelStore:
    """Paths and crash-safe writes for `<root>/<project>/models/<name>/`.

    Every path it builds stays inside `root` (see `inside`); a name that breaks the name rule or
    a model folder that links outside the root raises before anything is read or written.
    """

    def __init__(self, root: Path, project: str, name: str) -> None:
        self.root = root
        self.project = check_name(project, "project name")
        self.name = check_name(name, "model name")
        self.dir = inside(root, project, "models", name)
        self.checkpoints_dir = self._path("checkpoints")
        self.history_path = self._path("history.jsonl")

    def _path(self, *parts: str) -> Path:
        """A path in this model's folder, refused if it resolves outside the root."""
        return inside(self.root, self.project, "models", self.name, *parts)

    # ------------------------------------------------------------------------------ checkpoints

    def checkpoint_dir(self, step: int) -> Path:
        return self._path("checkpoints", f"{step:04d}")

    def checkpoint_steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending (temporary folders are not checkpoints;
        nor is a step folder that links outside the root)."""
        if not self.checkpoints_dir.is_dir():
            return []
        root = self.root.resolve()
        return sorted(
            int(path.name)
            for path in self.checkpoints_dir.iterdir()
            if path.name.isascii()
            and path.name.isdigit()
            and (path / STEP_FILE).is_file()
            and (path / STEP_FILE).resolve().is_relative_to(root)
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
        tmp = self._path("checkpoints", f"{TMP_PREFIX}{step:04d}-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            fault_point("before_checkpoint")
            write_files(tmp)
            _write_json_synced(tmp / STEP_FILE, {"step": step, **state})
            for path in tmp.iterdir():
                _fsync_path(path)
        except Exception:  # a failed write leaves nothing behind (a kill's leftover goes at start)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fault_point("before_rename")
        final = self.checkpoint_dir(step)
        if final.exists():  # a re-run of a step that was rolled back: replace it whole
            self.delete_checkpoint(step)
        os.rename(tmp, final)
        _fsync_path(self.checkpoints_dir)
        return final

    def checkpoint_files(self, step: int) -> list[Path]:
        """The files of checkpoint `step`, relative to its folder; a symbolic link is refused
        (a fork copies only files that are the checkpoint's own)."""
        source = self.checkpoint_dir(step)
        files = []
        for folder, subfolders, names in os.walk(source, followlinks=False):
            here = Path(folder)
            for entry in [*subfolders, *names]:
                if (here / entry).is_symlink():
                    raise UnsafePathError(
                        f"Checkpoint {self.project}/{self.name}@{step} holds a symbolic link "
                        f"({(here / entry).relative_to(source)}): only its own files are copied."
                    )
            files += [(here / name).relative_to(source) for name in names]
        return sorted(files)

    def read_step_state(self, step: int) -> dict[str, Any]:
        return json.loads((self.checkpoint_dir(step) / STEP_FILE).read_text())

    def remove_stale_temporaries(self) -> int:
        """Delete the temporary folders of checkpoint writes and deletions a crash interrupted;
        returns how many were removed."""
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
        """Delete checkpoint `step`: renamed out of the steps first, then removed, so a crash
        mid-delete leaves a temporary folder (see `remove_stale_temporaries`), not half a step."""
        trash = self._path("checkpoints", f"{TMP_PREFIX}deleting-{step:04d}-{os.getpid()}")
        if trash.exists():
            shutil.rmtree(trash)
        os.rename(self.checkpoint_dir(step), trash)
        _fsync_path(self.checkpoints_dir)
        fault_point("before_checkpoint_removal")
        shutil.rmtree(trash)

    # ---------------------------------------------------------------------------------- history

    def append_history(self, row: dict[str, Any]) -> None:
        """Append one row; a single write call so a crash leaves at most a torn last line."""
        self.dir.mkdir(parents=True, exist_ok=True)
        # The time is the store's: a row's own `recorded_at` cannot replace it.
        line = json.dumps({**row, "recorded_at": time.time()}, allow_nan=False) + "\n"
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_history(self) -> list[dict[str, Any]]:
        """All complete rows; a torn last line (or a damaged one) is skipped."""
        return [row for block in _line_blocks(self.history_path) for _, row in _rows_of(block)]

    def history_json(self, piece_bytes: int = HISTORY_BLOCK_BYTES) -> Iterator[bytes]:
        """`{"rows": [...]}` as JSON, in pieces of about `piece_bytes`: the complete rows' own
        lines, joined (each parsed once, to skip a torn or damaged line, never encoded again).
        Each piece costs the interpreter short steps only: the history route runs them on worker
        threads beside the event loop, where one read, split and join of a 32 MB file held the
        loop's turn for tens of milliseconds at a time."""
        opening = b'{"rows":['
        for block in _line_blocks(self.history_path, piece_bytes):
            lines = [line.encode() for line, _ in _rows_of(block)]
            if lines:
                yield opening + b",".join(lines)
                opening = b","
        yield b"]}" if opening == b"," else b'{"rows":[]}'

    def repair_history(self) -> list[str]:
        """Make history agree with the checkpoints after a crash; returns what was repaired."""
        repairs: list[str] = []
        stale = list(self.dir.glob(f"{TMP_PREFIX}{self.history_path.name}-*"))
        for path in stale:  # a crash during an earlier repair: history.jsonl itself is whole
            path.unlink(missing_ok=True)
        if stale:
            repairs.append("removed an unfinished rewrite of history.jsonl left by a crash")
        if self.history_path.is_file():
            data = self.history_path.read_bytes()
            if data and not data.endswith(b"\n"):
                _write_bytes_synced(self.history_path, data[: data.rfind(b"\n") + 1])
                repairs.append("dropped a torn last line of history.jsonl")
        rows = self.read_history()
        # Train rows for steps whose checkpoint no longer exists (rolled back) stay: they happened.
        trained_steps = {row.get("step") for row in rows if row.get("type") in ("train", "sft")}
        for step in self.checkpoint_steps():
            if step == 0 or step in trained_steps:
                continue
            state = self.read_step_state(step)
            if state.get("kind") in ("train", "sft"):
                if self._restore_step_trajectories(step):
                    repairs.append(f"logged the trajectories of step {step} from its checkpoint")
                self.append_history(
                    {"type": state["kind"], "step": step, "metrics": state.get("metrics", {})}
                )
                repairs.append(f"rebuilt the history row of step {step} from its checkpoint")
        return repairs

    def _restore_step_trajectories(self, step: int) -> bool:
        """Log the trajectories checkpoint `step` trained on, unless they were logged already."""
        copy = self.checkpoint_dir(step) / STEP_TRAJECTORIES
        rows = read_trajectories(copy) if copy.is_file() else []
        logged = self.trajectories_path("train", step - 1)
        # A write adds all its rows or none: the first row present means the batch is there.
        if not rows or (logged.is_file() and rows[0] in read_trajectories(logged)):
            return False
        self.write_trajectories("train", step - 1, rows)
        return True

    # ----------------------------------------------------------------------------- trajectories

    def trajectories_path(self, split: str, step: int) -> Path:
        if not is_split(split):
            raise InvalidNameError(f"Invalid split {split!r}: use letters, digits, '_' or '-'.")
        return self._path("trajectories", split, f"{step:04d}.jsonl.gz")

    def write_trajectories(self, split: str, step: int, rows: list[dict[str, Any]]) -> Path:
        """Add trajectories (one JSON object each) to `trajectories/<split>/<step>.jsonl.gz`.

        The file is replaced whole (its bytes so far plus one gzip member with `rows`, written
        beside it, flushed, renamed): a crash leaves the old file or the new one, never a torn one.
        """
        path = self.trajectories_path(split, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
        with open(tmp, "wb") as out:
            if path.is_file():  # gzip members concatenate: earlier logs of the step are kept
                with open(path, "rb") as earlier:
                    shutil.copyfileobj(earlier, out)
            out.write(_gzip_rows(rows))
            out.flush()
            os.fsync(out.fileno())
        fault_point("before_trajectories_rename")
        os.replace(tmp, path)
        _fsync_path(path.parent)
        return path

    def trajectory_files(self) -> list[tuple[str, int, Path]]:
        """(split, step, path) of every trajectories file, by split then step."""
        folder = self._path("trajectories")
        found = []
        for split_dir in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not is_split(split_dir.name) or not split_dir.is_dir():
                continue
            for path in sorted(split_dir.iterdir()):
                if match := TRAJECTORY_FILE_PATTERN.fullmatch(path.name):
                    found.append((split_dir.name, int(match.group(1)), path))
        return found

    def repair_trajectories(self) -> list[str]:
        """Remove writes a crash left unfinished and rewrite damaged files from what is readable.

        A damaged file's original bytes stay beside it as `<file>.damaged`; returns what was done.
        """
        repairs: list[str] = []
        folder = self._path("trajectories")
        stale = [
            path
            for split_dir in (folder.iterdir() if folder.is_dir() else [])
            if split_dir.is_dir()
            for path in split_dir.iterdir()
            if path.name.startswith(TMP_PREFIX)
        ]
        for path in stale:
            path.unlink(missing_ok=True)
        if stale:
            repairs.append(f"removed {len(stale)} unfinished trajectories write(s) left by a crash")
        for split, step, path in self.trajectory_files():
            content = read_trajectory_file(path)
            if not content.damaged:
                continue
            kept = path.with_name(path.name + DAMAGED_SUFFIX)
            for number in itertools.count(2):  # an earlier repair's evidence is kept too
                if not kept.exists():
                    break
                kept = path.with_name(f"{path.name}{DAMAGED_SUFFIX}-{number}")
            _write_bytes_synced(kept, path.read_bytes())
            _write_bytes_synced(path, _gzip_rows(content.rows))
            repairs.append(
                f"trajectories {split} step {step}: {content.note()}; kept {len(content.rows)} "
                f"record(s), the damaged original is {kept.name}"
            )
        return repairs

    # ----------------------------------------------------------------------------------- config

    def write_model_config(self, config: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json_synced(self._path(MODEL_CONFIG_FILE), config)

    def read_model_config(self) -> dict[str, Any] | None:
        path = self._path(MODEL_CONFIG_FILE)
        return json.loads(path.read_text()) if path.is_file() else None


# --------------------------------------------------------------------------- trajectory files


@dataclass
class TrajectoryFile:
    """What could be read from a trajectories file, and what could not."""

    rows: list[dict[str, Any]]
    damaged_sections: int = 0  # gzip members torn (a crash mid-append) or garbled
    damaged_bytes: int = 0  # compressed bytes in those members
    bad_lines: int = 0  # decoded lines that were not one whole JSON object

    @property
    def damaged(self) -> bool:
        return bool(self.damaged_sections or self.bad_lines)

    def note(self) -> str:
        """What was cut, for logs and the review page ('' when nothing)."""
        if not self.damaged:
            return ""
        parts = []
        if self.damaged_sections:
            parts.append(
                f"{self.damaged_sections} damaged section(s) ({self.damaged_bytes} bytes) skipped"
            )
        if self.bad_lines:
            parts.append(f"{self.bad_lines} unreadable record(s) skipped")
        return "the file is damaged (a crash while it was written?): " + ", ".join(parts)


def read_trajectories(path: Path) -> list[dict[str, Any]]:
    """The readable rows of a `trajectories/<split>/<step>.jsonl.gz` file (damage skipped)."""
    return read_trajectory_file(path).rows


def read_trajectory_file(path: Path) -> TrajectoryFile:
    """Every record that can be read, member by member; a damaged member is counted and skipped,
    and reading resumes at the next gzip member after it."""
    data = path.read_bytes()
    content = TrajectoryFile([])
    position = 0
    while position < len(data):
        decoded, end, complete = _decode_member(data, position)
        lines = decoded.split(b"\n")
        partial = lines.pop()  # b"" after a whole member; a record cut short otherwise
        if complete and partial.strip():
            lines.append(partial)  # a last record without its newline, but whole
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                row = None
            if isinstance(row, dict):
                content.rows.append(row)
            else:
                content.bad_lines += 1
        if complete:
            position = end
            continue
        following = data.find(GZIP_MAGIC, position + 1)
        resume = following if following != -1 else len(data)
        content.damaged_sections += 1
        content.damaged_bytes += resume - position
        position = resume
    return content


def write_trajectory_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write `rows` as a new trajectories file at `path` (one gzip member, flushed)."""
    with open(path, "wb") as out:
        out.write(_gzip_rows(rows))
        out.flush()
        os.fsync(out.fileno())


def _gzip_rows(rows: list[dict[str, Any]]) -> bytes:
    text = "".join(json.dumps(row, default=str) + "\n" for row in rows)
    return gzip.compress(text.encode(), mtime=0)


def _decode_member(data: bytes, start: int, chunk: int = 1 << 16) -> tuple[bytes, int, bool]:
    """Decompress the gzip member at `start`: (its bytes so far, where it ends, whether whole)."""
    decoder = zlib.decompressobj(wbits=31)  # 31: gzip framing, its CRC checked at the end
    output: list[bytes] = []
    position = start
    try:
        while position < len(data) and not decoder.eof:
            piece = data[position : position + chunk]
            output.append(decoder.decompress(piece))
            position += len(piece)
    except zlib.error:
        return b"".join(output), position, False
    if not decoder.eof:
        return b"".join(output), position, False
    return b"".join(output), position - len(decoder.unused_data), True


def _line_blocks(path: Path, block_bytes: int = HISTORY_BLOCK_BYTES) -> Iterator[str]:
    """`path`'s text up to its size when opened, in blocks of whole lines of about `block_bytes`
    (a longer line is one block), decoded as `read_text(errors="replace")` decodes it whole."""
    if not path.is_file():
        return
    with path.open("rb") as file:
        left, pending = os.fstat(file.fileno()).st_size, bytearray()
        while left > 0 and (block := file.read(min(block_bytes, left))):
            left -= len(block)
            pending += block
            if end := pending.rfind(b"\n") + 1:
                yield pending[:end].decode(errors="replace")
                del pending[:end]
        if pending:  # a last line without its newline: torn, or whole but for the newline
            yield pending.decode(errors="replace")


def _rows_of(text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each complete row in `text` (whole lines): its line, and the row parsed."""
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            yield line, row


def _write_bytes_synced(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


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
