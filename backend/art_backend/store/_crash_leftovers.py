"""At the server's start: the temporary checkpoint folders that killed processes left, removed.

The crash protocol (`_checkpoints`) writes a checkpoint into `checkpoints/.tmp-<step>-<pid>/` and
renames it into place; a kill before the rename leaves that folder. The next registration of the
model removes it, but a model killed in its first checkpoint (a Tinker `create_model`: a fresh
model id, never registered again) would keep it for ever. So at start every model's folder is
swept, and a temporary folder goes when the process named in it is gone:

    .tmp-<step>-<pid>, .tmp-deleting-<step>-<pid>   pid not running      removed
                                                    pid is this process  removed (a restarted
                                                                         container reuses ids)
                                                    pid running          kept: another server on
                                                                         the same folder, mid-write
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from art_backend._errors import InvalidNameError, StoreFileDamagedError
from art_backend.store._checkpoints import TMP_PREFIX, ModelStore


def remove_crash_leftovers(root: Path) -> list[Path]:
    """Remove the temporary checkpoint folders under `root` whose writer is gone; returns them.
    A model folder the store refuses (a bad name, a link leading outside `root`) is left alone."""
    removed: list[Path] = []
    for checkpoints in sorted(root.glob("*/models/*/checkpoints")):
        model = checkpoints.parent
        try:
            store = ModelStore(root, model.parent.parent.name, model.name)
        except (InvalidNameError, StoreFileDamagedError):
            continue
        if not store.checkpoints_dir.is_dir():
            continue
        for path in sorted(store.checkpoints_dir.iterdir()):
            leftover = path.name.startswith(TMP_PREFIX) and path.is_dir() and not path.is_symlink()
            if leftover and not writer_running(path.name):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def writer_running(name: str) -> bool:
    """Whether the process a temporary folder's name ends with (`-<pid>`) runs and is not this
    one (a folder named with this process's id predates it)."""
    pid = name.rpartition("-")[2]
    if not (pid.isascii() and pid.isdigit()) or int(pid) in (0, os.getpid()):
        return False
    if os.name != "posix":  # there os.kill(pid, 0) would end the process: assume it runs
        return True
    try:
        os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
    except PermissionError:
        return True  # another user's process
    except (ProcessLookupError, OverflowError):
        return False
    return True
