"""The suite's parallel groups and order (tests/support/suite_order.py): a file whole on one
worker, the Ray files together, the heaviest groups first, and a table refreshed from a report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import suite_order


def test_a_file_is_one_group_and_the_ray_files_are_one():
    for nodeid in ("tests/core/test_x.py::test_a[remote]", "tests/core/test_x.py::TestY::test_b"):
        assert suite_order.parallel_group(nodeid) == "tests/core/test_x.py"
    ray = {suite_order.parallel_group(f"tests/ray/{name}::t") for name in ("a.py", "b.py")}
    assert ray == {"ray"}


def test_groups_run_heaviest_first_and_a_new_file_counts_as_heavy(monkeypatch, tmp_path: Path):
    table = tmp_path / "durations.json"
    table.write_text(
        json.dumps(
            {"tests/a.py": 5.0, "tests/b.py": 300.0, "tests/ray/r1.py": 20, "tests/ray/r2.py": 30}
        )
    )
    monkeypatch.setattr(suite_order, "DURATIONS", table)
    ids = [
        "tests/a.py::one", "tests/a.py::two", "tests/b.py::one", "tests/new.py::one",
        "tests/ray/r1.py::one", "tests/ray/r2.py::one", "tests/ray/r1.py::two",
    ]  # fmt: skip
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert suite_order.heaviest_files_first(items) == items  # one process: the usual order

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    ordered = [item.nodeid for item in suite_order.heaviest_files_first(items)]
    assert ordered == [
        "tests/b.py::one",  # 300 s
        "tests/new.py::one",  # not in the table: UNKNOWN_FILE_SECONDS
        "tests/ray/r1.py::one",  # the Ray group, 50 s in all, in collection order
        "tests/ray/r2.py::one",
        "tests/ray/r1.py::two",
        "tests/a.py::one",
        "tests/a.py::two",
    ]


def test_the_table_is_seconds_per_file_from_a_junit_report(tmp_path: Path):
    report = tmp_path / "report.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.core.test_x" name="test_a" time="1.25"/>'
        '<testcase classname="tests.core.test_x" name="test_b" time="2.5"/>'
        '<testcase classname="tests.langgraph.test_y.TestChat" name="test_c" time="4"/>'
        "</testsuite></testsuites>"
    )
    assert suite_order.seconds_per_file(report) == {
        "tests/core/test_x.py": 3.8,
        "tests/langgraph/test_y.py": 4.0,
    }


def test_the_committed_table_names_files_that_exist():
    table = json.loads(suite_order.DURATIONS.read_text())
    root = Path(__file__).resolve().parent.parent
    missing = [path for path in table if not (root / path).is_file()]
    assert not missing, f"refresh tests/support/durations.json (suite_order's docstring): {missing}"
    assert all(isinstance(seconds, int | float) and seconds >= 0 for seconds in table.values())


def test_under_two_workers_each_group_runs_whole_on_one(tmp_path: Path):
    """A real `pytest -n 2` over files of several tests each: every file's tests (every Ray
    file's) report one worker. pytest-xdist's own `--dist loadgroup` fails this on pytest 9."""
    pytest.importorskip("xdist")
    record = """
import os, pathlib
def record(name):
    pathlib.Path(os.environ["RECORD"], f"{name}-{os.environ['PYTEST_XDIST_WORKER']}").touch()
"""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for path in (
        "tests/test_a.py",
        "tests/test_b.py",
        "tests/ray/test_r1.py",
        "tests/ray/test_r2.py",
    ):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        name = Path(path).stem
        cases = "".join(f"\ndef test_{n}():\n    record({name!r})\n" for n in range(6))
        (tmp_path / path).write_text(record + cases)
    records = tmp_path / "records"
    records.mkdir()
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "tests.support.suite_order",
         "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "RECORD": str(records), "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    workers: dict[str, set[str]] = {}
    for mark in records.iterdir():
        name, worker = mark.name.rsplit("-", 1)
        workers.setdefault("ray" if name.startswith("test_r") else name, set()).add(worker)
    assert set(workers) == {"test_a", "test_b", "ray"}
    assert all(len(found) == 1 for found in workers.values()), workers
