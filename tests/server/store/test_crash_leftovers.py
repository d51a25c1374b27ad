"""At start, the temporary checkpoint folders of killed writers go; a live writer's stay.

The kill itself, in a real `create_model`, is in tests/server/tinker/test_tinker_settings.py;
here the leftovers are made by hand, one per case of `_crash_leftovers`'s table."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from art_backend.store._checkpoints import ModelStore
from art_backend.store._crash_leftovers import remove_crash_leftovers


@pytest.fixture
def running_pid() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def leftover(root: Path, model: str, name: str) -> Path:
    folder = ModelStore(root, "tinker", model).checkpoints_dir / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"half")
    return folder


def test_a_gone_writers_folders_are_removed_and_a_running_writers_kept(
    tmp_path: Path, running_pid: int
):
    dead = gone_pid()
    killed = leftover(tmp_path, "tinker-a", f".tmp-0000-{dead}")
    deleting = leftover(tmp_path, "tinker-b", f".tmp-deleting-0003-{dead}")
    reused = leftover(tmp_path, "tinker-b", f".tmp-0004-{os.getpid()}")  # an id reused
    writing = leftover(tmp_path, "tinker-c", f".tmp-0001-{running_pid}")
    step = ModelStore(tmp_path, "tinker", "tinker-c").checkpoints_dir / "0000"
    step.mkdir()

    assert sorted(remove_crash_leftovers(tmp_path)) == sorted([killed, deleting, reused])
    assert not killed.exists() and not deleting.exists() and not reused.exists()
    assert writing.is_dir() and step.is_dir()


def test_a_model_folder_the_store_refuses_is_left_alone(tmp_path: Path):
    outside = tmp_path / "outside"
    killed = outside / "checkpoints" / f".tmp-0000-{gone_pid()}"
    killed.mkdir(parents=True)
    root = tmp_path / "art"
    (root / "tinker" / "models").mkdir(parents=True)
    (root / "tinker" / "models" / "linked").symlink_to(outside)

    assert remove_crash_leftovers(root) == []
    assert killed.is_dir()


def test_a_store_without_models_has_nothing_to_remove(tmp_path: Path):
    assert remove_crash_leftovers(tmp_path / "not-created-yet") == []
