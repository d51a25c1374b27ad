"""A crash in the middle of a repair or a checkpoint deletion loses nothing that was whole, and
the next start still serves: repairs write beside a file and rename, deletions rename first, and
an older step that does not load is skipped at start (the latest still stops it, naming itself).
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from art_backend.store._checkpoints import (
    FAULT_ENV,
    STEP_FILE,
    ModelStore,
    read_trajectory_file,
)
from art_backend.testing import ModelLoadError
from tests.support.servers import RunningServer, running_server, start_server

MODELS = "/v1/training/models"

# Runs one store call in a child process that the kernel kills (SIGXFSZ) as soon as a file it
# writes reaches LIMIT bytes: a crash in the middle of a write, wherever the call writes.
KILLED_MID_WRITE = """
import resource, signal, sys
from pathlib import Path
from art_backend.store._checkpoints import ModelStore

art_path, call, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
store = ModelStore(art_path, "p", "good")
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the default is to die
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
getattr(store, call)()
"""

DELETE_STEP = """
import sys
from pathlib import Path
from art_backend.store._checkpoints import ModelStore

ModelStore(Path(sys.argv[1]), "p", "good").delete_checkpoint(int(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def trained_template(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --path with `p/good` (tiny model, step 0) written by a real server that then stopped."""
    art_path = tmp_path_factory.mktemp("template") / "art"
    with running_server(tiny_model_dir, art_path) as running:
        assert register(running).status_code == 200
    return art_path


@pytest.fixture
def art_path(trained_template: Path, tmp_path: Path) -> Path:
    """This test's own copy of the template."""
    return Path(shutil.copytree(trained_template, tmp_path / "art"))


def register(server: RunningServer) -> httpx.Response:
    body = {"project": "p", "name": "good", "base_model": "tiny"}
    return httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)


def add_steps(art_path: Path, *steps: int) -> ModelStore:
    """Checkpoints `steps` of p/good, each holding the files of its step 0."""
    store = ModelStore(art_path, "p", "good")

    def copy(folder: Path) -> None:
        for relative in store.checkpoint_files(0):
            if relative.name != STEP_FILE:
                shutil.copyfile(store.checkpoint_dir(0) / relative, folder / relative)

    for step in steps:
        store.write_checkpoint(step, copy, {"kind": "train", "metrics": {"loss": 1.0}})
    return store


def killed_mid_write(art_path: Path, call: str, limit: int) -> None:
    """`ModelStore.<call>()` in a child process killed once a file it writes reaches `limit`."""
    result = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WRITE, str(art_path), call, str(limit)],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == -signal.SIGXFSZ, result.stderr.decode()


def chat(server: RunningServer, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


# ---------------------------------------------------------------------------------- repairs


def test_a_crash_while_history_is_repaired_keeps_every_row(tiny_model_dir: Path, art_path: Path):
    store = ModelStore(art_path, "p", "good")
    for step in range(40):
        store.append_history({"type": "log", "step": step, "metrics": {"reward": step / 40}})
    rows = store.read_history()
    with open(store.history_path, "a") as history:
        history.write('{"type": "log", "st')  # the torn last line a crash mid-append leaves
    original = store.history_path.read_bytes()

    killed_mid_write(art_path, "repair_history", limit=len(original) // 2)

    assert store.history_path.read_bytes() == original  # untouched: every row still there
    assert store.read_history() == rows
    assert list(store.dir.glob(".tmp-history.jsonl-*"))  # the rewrite the kill interrupted

    with running_server(tiny_model_dir, art_path) as running:
        response = register(running)

    assert response.status_code == 200, response.text
    assert (
        "removed an unfinished rewrite of history.jsonl left by a crash"
        in (response.json()["repairs"])
    )
    assert not list(store.dir.glob(".tmp-*"))
    assert store.history_path.read_bytes() == original[: original.rfind(b"\n") + 1]
    assert store.read_history() == rows


def test_a_crash_while_trajectories_are_repaired_keeps_the_original(
    tiny_model_dir: Path, art_path: Path
):
    store = ModelStore(art_path, "p", "good")
    rows = [{"id": index, "reward": index / 50, "text": "x" * 40} for index in range(50)]
    path = store.write_trajectories("train", 0, rows)
    torn = gzip.compress(b'{"id": 50}\n', mtime=0)[:12]  # an older version's torn append
    with open(path, "ab") as out:
        out.write(torn)
    original = path.read_bytes()

    killed_mid_write(art_path, "repair_trajectories", limit=len(original) // 2)

    assert path.read_bytes() == original
    assert list(path.parent.glob(".tmp-*"))  # the rewrite the kill interrupted

    with running_server(tiny_model_dir, art_path) as running:
        response = register(running)

    assert response.status_code == 200, response.text
    assert not list(path.parent.glob(".tmp-*"))
    content = read_trajectory_file(path)
    assert not content.damaged and content.rows == rows
    assert (path.parent / (path.name + ".damaged")).read_bytes() == original


# -------------------------------------------------------------------------------- deletions


def test_a_crash_while_a_checkpoint_is_deleted_leaves_no_half_step(
    tiny_model_dir: Path, art_path: Path
):
    store = add_steps(art_path, 1, 2)
    child = subprocess.Popen(
        [sys.executable, "-c", DELETE_STEP, str(art_path), "1"],
        env={**os.environ, FAULT_ENV: "before_checkpoint_removal:60"},
    )
    try:
        deadline = time.monotonic() + 60
        while not list(store.checkpoints_dir.glob(".tmp-*")) and child.poll() is None:
            assert time.monotonic() < deadline, "the deletion never reached its fault point"
            time.sleep(0.05)
        assert child.poll() is None, "the deletion ran to its end without pausing"
    finally:
        child.kill()
        child.wait()

    assert not store.checkpoint_dir(1).exists()  # gone as a step, even though not yet removed
    assert store.checkpoint_steps() == [0, 2]
    with running_server(tiny_model_dir, art_path) as running:
        # The killed writer's temporary folder went at the start, before any registration.
        assert sorted(path.name for path in store.checkpoints_dir.iterdir()) == ["0000", "0002"]
        assert "good@2" in running.service.engine.adapters
        response = register(running)
        assert response.status_code == 200, response.text
        assert chat(running, "good@2").status_code == 200

    assert response.json()["step"] == 2


def remove_weights(step_dir: Path) -> None:
    (step_dir / "adapter_model.safetensors").unlink()  # what a kill inside rmtree leaves


def truncate_weights(step_dir: Path) -> None:
    weights = step_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


def garble_config(step_dir: Path) -> None:
    (step_dir / "adapter_config.json").write_bytes(b"\x00garbage{")


@pytest.mark.parametrize("damage", [remove_weights, truncate_weights, garble_config])
def test_an_older_step_that_does_not_load_is_skipped_at_start_with_a_warning(
    tiny_model_dir: Path, art_path: Path, damage, caplog: pytest.LogCaptureFixture
):
    store = add_steps(art_path, 1, 2)
    damage(store.checkpoint_dir(1))  # the older of the two steps served at start

    with running_server(tiny_model_dir, art_path) as running:
        adapters = running.service.engine.adapters
        assert "good@2" in adapters and "good@1" not in adapters
        assert f"not serving {store.checkpoint_dir(1)}, an older step of its model" in caplog.text
        response = register(running)
        assert response.status_code == 200, response.text
        assert response.json()["step"] == 2
        assert chat(running, "good@2").status_code == 200
        assert chat(running, "tiny").status_code == 200


def test_a_latest_step_that_does_not_load_still_stops_the_start_naming_it(
    tiny_model_dir: Path, art_path: Path
):
    store = add_steps(art_path, 1)
    truncate_weights(store.checkpoint_dir(1))

    with pytest.raises(ModelLoadError) as raised:
        start_server(tiny_model_dir, art_path)

    assert f"Checkpoint {store.checkpoint_dir(1)} does not load" in raised.value.message
