"""Trajectories files: a crash while one is written loses at most that write, never the file."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from art_backend.testing import ModelStore, read_trajectories, read_trajectory_file
from tests.support.review_data import MODEL, PROJECT, start_review_server, tool_trajectory

BATCHES = [
    [{"group": 0, "id": f"b{batch}-{n}", "reward": float(n)} for n in range(3)]
    for batch in range(3)
]


def ids(rows: list[dict]) -> list[str]:
    return [row["id"] for row in rows]


def write_batches(store: ModelStore) -> tuple[Path, int]:
    """Three writes to one step's file; returns its path and where the last write starts."""
    store.write_trajectories("val", 3, BATCHES[0])
    path = store.write_trajectories("val", 3, BATCHES[1])
    last_starts = path.stat().st_size
    store.write_trajectories("val", 3, BATCHES[2])
    return path, last_starts


def test_every_write_is_kept_in_order(tmp_path: Path):
    path, _ = write_batches(ModelStore(tmp_path, "p", "m"))
    assert path == tmp_path / "p/models/m/trajectories/val/0003.jsonl.gz"
    assert ids(read_trajectories(path)) == ids(BATCHES[0] + BATCHES[1] + BATCHES[2])
    assert [p.name for p in path.parent.iterdir()] == ["0003.jsonl.gz"]  # no temporaries left


@pytest.mark.parametrize("keep", [1, 3, 10, 11, 25, -8, -1])
def test_a_torn_last_write_loses_only_that_write(tmp_path: Path, keep: int):
    store = ModelStore(tmp_path, "p", "m")
    path, last_starts = write_batches(store)
    data = path.read_bytes()
    cut = last_starts + keep if keep > 0 else len(data) + keep
    path.write_bytes(data[:cut])  # what a SIGKILL mid-append left with the old writer

    content = read_trajectory_file(path)

    # Earlier writes whole; of the torn one, only records that decoded completely (if any).
    assert ids(content.rows)[:6] == ids(BATCHES[0] + BATCHES[1])
    assert ids(content.rows)[6:] == ids(BATCHES[2])[: len(content.rows) - 6]
    assert content.damaged_sections == 1 and content.damaged_bytes == cut - last_starts
    assert "damaged section" in content.note()


@pytest.mark.parametrize("offset", [0, 2, 4, 12, 30, -9, -3])
def test_a_garbled_last_write_loses_only_that_write(tmp_path: Path, offset: int):
    store = ModelStore(tmp_path, "p", "m")
    path, last_starts = write_batches(store)
    data = bytearray(path.read_bytes())
    position = last_starts + offset if offset >= 0 else len(data) + offset
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))

    rows = read_trajectory_file(path).rows

    assert ids(rows)[:6] == ids(BATCHES[0] + BATCHES[1])
    assert set(ids(rows)) <= set(ids(BATCHES[0] + BATCHES[1] + BATCHES[2]))


def test_reading_resumes_after_a_damaged_write_in_the_middle(tmp_path: Path):
    # The old writer appended in place: a torn member, then the next log appended after it
    # ("invalid distance too far back" for gzip.open from then on).
    path = tmp_path / "0000.jsonl.gz"
    members = [
        gzip.compress(b"".join(json.dumps(row).encode() + b"\n" for row in batch), mtime=0)
        for batch in BATCHES
    ]
    path.write_bytes(members[0] + members[1][: len(members[1]) // 2] + members[2])
    with pytest.raises((EOFError, zlib.error, gzip.BadGzipFile)), gzip.open(path, "rt") as old:
        old.read()  # the old reader loses the whole file

    content = read_trajectory_file(path)

    assert ids(content.rows)[:3] == ids(BATCHES[0]) and ids(content.rows)[-3:] == ids(BATCHES[2])
    assert content.damaged_sections == 1


def test_lines_that_are_not_records_are_counted_not_fatal(tmp_path: Path):
    path = tmp_path / "0000.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"id": "a"}\nnot json\n[1, 2]\n{"id": "b"}\n', mtime=0))
    content = read_trajectory_file(path)
    assert ids(content.rows) == ["a", "b"] and content.bad_lines == 2
    assert "2 unreadable record(s)" in content.note()


def test_repair_rewrites_a_damaged_file_keeps_the_original_and_says_what_was_cut(tmp_path: Path):
    store = ModelStore(tmp_path, "p", "m")
    path, last_starts = write_batches(store)
    torn = path.read_bytes()[: last_starts + 20]
    path.write_bytes(torn)
    # A crash between writing a new version and renaming it leaves only the temporary.
    leftover = path.with_name(f".tmp-{path.name}-12345")
    leftover.write_bytes(b"half a write")

    repairs = store.repair_trajectories()

    assert repairs[0] == "removed 1 unfinished trajectories write(s) left by a crash"
    assert repairs[1].startswith("trajectories val step 3: the file is damaged")
    assert "1 damaged section(s) (20 bytes)" in repairs[1] and "kept 6 record(s)" in repairs[1]
    assert not leftover.exists()
    assert (path.parent / "0003.jsonl.gz.damaged").read_bytes() == torn
    assert not read_trajectory_file(path).damaged
    assert ids(read_trajectories(path)) == ids(BATCHES[0] + BATCHES[1])
    assert store.repair_trajectories() == []  # idempotent

    store.write_trajectories("val", 3, BATCHES[2])  # appends work again after the repair
    assert ids(read_trajectories(path)) == ids(BATCHES[0] + BATCHES[1] + BATCHES[2])


def test_an_unfinished_write_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = ModelStore(tmp_path, "p", "m")
    path, _ = write_batches(store)
    before = path.read_bytes()

    class Killed(BaseException):
        """Stands for a SIGKILL after the new version was written, before its rename."""

    def killed(*_):
        raise Killed

    monkeypatch.setattr("art_backend.store._checkpoints.os.replace", killed)
    with pytest.raises(Killed):
        store.write_trajectories("val", 3, BATCHES[0])
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert not read_trajectory_file(path).damaged
    assert store.repair_trajectories() == [
        "removed 1 unfinished trajectories write(s) left by a crash"
    ]


# ------------------------------------------------------------------------- the review pages


@pytest.fixture
def damaged_review(tmp_path: Path) -> Iterator[httpx.Client]:
    """`art review` over a store whose train step 0 file was torn by a crash mid-append."""
    store = ModelStore(tmp_path, PROJECT, MODEL)
    store.write_trajectories("train", 0, [{"group": 0, **tool_trajectory("t-a", 1.0, "12")}])
    path = store.write_trajectories("train", 0, [{"group": 1, **tool_trajectory("t-b", 0.0, "?")}])
    store.write_trajectories("val", 1, [{"group": 0, **tool_trajectory("v-a", 0.5, "12")}])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 15])
    server, thread, url = start_review_server(tmp_path)
    with httpx.Client(base_url=url, timeout=30) as client:
        yield client
    server.should_exit = True
    thread.join(10)


def test_the_review_shows_what_is_readable_of_a_damaged_step_and_says_so(
    damaged_review: httpx.Client,
):
    model = f"/review/{PROJECT}/{MODEL}"
    step = damaged_review.get(f"{model}/steps/train/0")
    assert step.status_code == 200
    assert "t-a" in step.text and "t-b" not in step.text
    assert 'role="alert"' in step.text and "the file is damaged" in step.text

    search = damaged_review.get(f"{model}/search", params={"q": "12"})
    assert search.status_code == 200
    assert "Damaged trajectories files" in search.text and "train step 0" in search.text
    assert "t-a" in search.text and "v-a" in search.text

    for page in (
        model,
        f"{model}/steps/train/0/groups/0",
        f"{model}/steps/train/0/trajectories/t-a",
    ):
        assert damaged_review.get(page).status_code == 200
