"""The suite's groups and order under pytest-xdist (`make test` runs `pytest -n 2`), a plugin of
the suite (tests/conftest.py).

A file is one group, so its module fixtures (a server, a cluster) start once, on one worker;
the Ray files (loopback and namespace hosts) share one group (each starts a loopback cluster of four processes, and two at once
on 2 cores only slow both). Groups go to the workers heaviest first, from `durations.json`
(seconds per file, measured): a long file that started last would leave one worker running it
alone. A file missing from the table counts as heavy, so a new slow file is not the last to start.

Refresh the table from a run's JUnit report (any machine: only the order follows from it):
    python -m pytest -n 2 --junitxml=/tmp/suite.xml
    python -m tests.support.suite_order /tmp/suite.xml
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
# The namespace hosts run Ray too (tests/netns/): one group with the loopback Ray files, so two
# Ray clusters never start at once.
RAY_FOLDERS = ("tests/ray/", "tests/netns/")
# A file the table does not know yet is placed as if it took this long (a heavy file's time).
UNKNOWN_FILE_SECONDS = 60.0


def file_of(nodeid: str) -> str:
    """`tests/core/test_x.py` of `tests/core/test_x.py::test_y[param]`."""
    return nodeid.split("::", 1)[0]


def parallel_group(nodeid: str) -> str:
    """The xdist group of a test: its file, or `ray` for every file under RAY_FOLDERS."""
    path = file_of(nodeid)
    return "ray" if path.startswith(RAY_FOLDERS) else path


def heaviest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with their groups in descending measured seconds, in collection order inside a
    group; unchanged outside an xdist worker, so a plain `pytest` keeps its usual order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return items
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    weight: Counter[str] = Counter()
    for path in {file_of(item.nodeid) for item in items}:
        weight[parallel_group(path)] += seconds.get(path, UNKNOWN_FILE_SECONDS)
    first_seen = {}
    for index, item in enumerate(items):
        first_seen.setdefault(parallel_group(item.nodeid), index)

    def key(indexed: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        group = parallel_group(indexed[1].nodeid)
        return (-weight[group], first_seen[group], indexed[0])

    return [item for _, item in sorted(enumerate(items), key=key)]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist hands out whole groups (`parallel_group`) in the workers' collection order.
    Its own `--dist loadgroup` cannot: it renames a test `<id>@<group>`, and pytest 9 ignores that
    name (`Item.nodeid` is built from the collection tree)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return parallel_group(nodeid)

    config.option.loadscopereorder = False  # the order is ours: heaviest first, by measurement
    return GroupScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """Heaviest groups first, before any other plugin's hook sees the list."""
    items[:] = heaviest_files_first(items)
    return (yield)


def seconds_per_file(junit_xml: Path) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests) in a JUnit report."""
    totals: Counter[str] = Counter()
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and not module[-1].startswith("test_"):
            module.pop()  # a test class's name after its module's
        if module:
            totals["/".join(module) + ".py"] += float(case.get("time", 0))
    return {path: round(total, 1) for path, total in sorted(totals.items())}


if __name__ == "__main__":
    table = seconds_per_file(Path(sys.argv[1]))
    DURATIONS.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {DURATIONS} ({len(table)} files, {sum(table.values()) / 60:.1f} min in all)")
