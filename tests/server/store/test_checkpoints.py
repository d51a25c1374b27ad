"""The model store: checkpoints appear whole or not at all, and history survives torn writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_backend.store._checkpoints import ModelStore, UnsafePathError, read_trajectories
from art_backend.testing import InvalidNameError


def write_files(folder: Path) -> None:
    (folder / "adapter_config.json").write_text("{}")


def test_checkpoint_is_renamed_into_place_complete(tmp_path: Path):
    store = ModelStore(tmp_path, "p", "m")
    final = store.write_checkpoint(3, write_files, {"kind": "train", "metrics": {"loss": 1.0}})
    assert final == tmp_path / "p/models/m/checkpoints/0003"
    assert sorted(p.name for p in final.iterdir()) == ["adapter_config.json", "step.json"]
    assert store.checkpoint_steps() == [3] and store.latest_step() == 3
    assert store.read_step_state(3)["metrics"] == {"loss": 1.0}


def test_failed_write_leaves_no_checkpoint_and_the_temporary_is_cleaned(tmp_path: Path):
    store = ModelStore(tmp_path, "p", "m")

    def crash(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        store.write_checkpoint(1, crash, {"kind": "train"})
    assert store.checkpoint_steps() == []
    assert list(store.checkpoints_dir.iterdir()) == []  # removed by the failed write itself
    # A state JSON cannot hold (a NaN metric): refused, and nothing left behind either.
    with pytest.raises(ValueError, match="JSON"):
        store.write_checkpoint(1, lambda folder: None, {"metrics": {"loss": float("nan")}})
    assert list(store.checkpoints_dir.iterdir()) == []
    assert store.remove_stale_temporaries() == 0


def test_a_folder_without_step_json_is_not_a_checkpoint(tmp_path: Path):
    store = ModelStore(tmp_path, "p", "m")
    (store.checkpoints_dir / "0002").mkdir(parents=True)
    assert store.checkpoint_steps() == []


def test_torn_history_line_is_dropped_and_missing_rows_rebuilt(tmp_path: Path):
    store = ModelStore(tmp_path, "p", "m")
    store.write_checkpoint(0, write_files, {"kind": "initial"})
    store.write_checkpoint(1, write_files, {"kind": "train", "metrics": {"loss": 0.5}})
    store.append_history({"type": "train", "step": 1, "metrics": {"loss": 0.5}})
    # Step 2 was checkpointed, then the process died before its history row was complete.
    store.write_checkpoint(2, write_files, {"kind": "train", "metrics": {"loss": 0.25}})
    with open(store.history_path, "a") as history:
        history.write('{"type": "train", "st')

    repairs = store.repair_history()

    assert len(repairs) == 2
    rows = store.read_history()
    assert [(row["type"], row["step"]) for row in rows] == [("train", 1), ("train", 2)]
    assert rows[1]["metrics"] == {"loss": 0.25}
    assert store.repair_history() == []  # idempotent
    assert all(json.loads(line) for line in store.history_path.read_text().splitlines())


@pytest.mark.parametrize("piece_bytes", [1, 64, 1024 * 1024])
def test_history_json_is_the_whole_rows_own_lines_in_bounded_pieces(
    tmp_path: Path, piece_bytes: int
):
    """Read a block of whole lines at a time (no piece holds the whole file): every complete
    row's own line, joined; a damaged middle line, a line that is not an object and a torn
    last line are skipped, and the answer is still valid JSON."""
    store = ModelStore(tmp_path, "p", "m")
    rows = [{"type": "log", "step": step, "note": "n" * 100} for step in range(20)]
    lines = [json.dumps(row) for row in rows]
    store.history_path.parent.mkdir(parents=True)
    damaged = [*lines[:7], '{"type": "log", "st', *lines[7:12], "[1, 2]", *lines[12:]]
    store.history_path.write_text("\n".join(damaged) + '\n{"type": "torn", "st')

    pieces = list(store.history_json(piece_bytes))

    body = b"".join(pieces)
    assert body == ('{"rows":[' + ",".join(lines) + "]}").encode()
    assert json.loads(body)["rows"] == rows == store.read_history()
    longest = max(len(line) for line in damaged) + len('{"rows":[') + 1
    assert max(len(piece) for piece in pieces) <= max(piece_bytes, longest)


def test_history_json_of_no_history_is_no_rows(tmp_path: Path):
    store = ModelStore(tmp_path, "p", "m")
    assert b"".join(store.history_json()) == b'{"rows":[]}'
    store.history_path.parent.mkdir(parents=True)
    store.history_path.write_text('{"type": "torn", "st')
    assert b"".join(store.history_json()) == b'{"rows":[]}'


def test_trajectories_append_per_split_and_step(tmp_path: Path):
    store = ModelStore(tmp_path, "p", "m")
    store.write_trajectories("val", 0, [{"reward": 1.0}])
    path = store.write_trajectories("val", 0, [{"reward": 0.0}])
    assert path.name == "0000.jsonl.gz"
    assert [row["reward"] for row in read_trajectories(path)] == [1.0, 0.0]


@pytest.mark.parametrize(
    ("project", "name"), [("..", "m"), ("p", "../m"), ("/etc", "m"), ("p", "a/b"), ("p", "a..b")]
)
def test_a_name_that_breaks_the_name_rule_never_reaches_the_disk(
    tmp_path: Path, project: str, name: str
):
    with pytest.raises(InvalidNameError):
        ModelStore(tmp_path / "art", project, name)
    assert not (tmp_path / "art").exists()


def test_a_model_folder_linking_outside_the_root_is_refused(tmp_path: Path):
    outside = tmp_path / "outside"
    (outside / "checkpoints/0000").mkdir(parents=True)
    (tmp_path / "art/p/models").mkdir(parents=True)
    (tmp_path / "art/p/models/m").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="outside the server's --path"):
        ModelStore(tmp_path / "art", "p", "m")


def test_a_step_folder_linking_outside_is_not_a_checkpoint(tmp_path: Path):
    store = ModelStore(tmp_path / "art", "p", "m")
    outside = tmp_path / "outside" / "0007"
    outside.mkdir(parents=True)
    (outside / "step.json").write_text('{"step": 7}')
    store.checkpoints_dir.mkdir(parents=True)
    (store.checkpoints_dir / "0007").symlink_to(outside)
    assert store.checkpoint_steps() == []
    with pytest.raises(UnsafePathError):
        store.checkpoint_dir(7)


def test_a_checkpoint_holding_a_link_cannot_be_copied(tmp_path: Path):
    store = ModelStore(tmp_path / "art", "p", "m")
    store.write_checkpoint(0, write_files, {"kind": "initial"})
    assert store.checkpoint_files(0) == [Path("adapter_config.json"), Path("step.json")]
    (tmp_path / "secret").write_text("x")
    (store.checkpoint_dir(0) / "extra").symlink_to(tmp_path / "secret")
    with pytest.raises(UnsafePathError, match=r"symbolic link \(extra\)"):
        store.checkpoint_files(0)
