"""The Tinker SDK's versions: a user's whole walk (`sdk_walkthrough`) on the locked `tinker`
(this interpreter) and on the next one, in an environment of its own.

The lock pins one SDK (requirements/constraints.txt); the next release runs from
ART_TINKER_NEXT_PYTHON, else .venv/tinker-next (`make .venv/.installed-tinker-next`, which installs
`tinker==$(TINKER_NEXT)` and nothing of ours: the walk imports only the SDK). Where neither is
there, that case skips with a line saying how to build it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'")

from tests.support.servers import RunningServer, running_tinker_server

ROOT = Path(__file__).resolve().parents[3]
WALK = Path(__file__).with_name("sdk_walkthrough.py")
BUILT_NEXT_PYTHON = ROOT / ".venv" / "tinker-next" / "bin" / "python"
API_KEY = "tml-versions-key"


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("art-tinker-versions")
    with running_tinker_server(tiny_model_dir, path, api_key=API_KEY) as running:
        yield running


def next_sdk_python() -> str:
    """ART_TINKER_NEXT_PYTHON when named (a broken one fails, not skips), else the built one."""
    named = os.environ.get("ART_TINKER_NEXT_PYTHON")
    if named:
        return named
    if BUILT_NEXT_PYTHON.exists():
        return str(BUILT_NEXT_PYTHON)
    pytest.skip(
        "no interpreter with the next tinker SDK: `make .venv/.installed-tinker-next` builds "
        ".venv/tinker-next (or set ART_TINKER_NEXT_PYTHON)"
    )


@pytest.mark.parametrize("sdk", ["locked", "next"])
def test_a_users_whole_walk_runs_on_the_sdk(sdk: str, server: RunningServer):
    python = sys.executable if sdk == "locked" else next_sdk_python()
    env = {**os.environ, "TINKER_TELEMETRY": "0"}
    done = subprocess.run(
        [python, str(WALK), server.url, API_KEY, "tiny"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(row for row in done.stdout.splitlines() if row.startswith("WALKTHROUGH "))
    walk = json.loads(line.removeprefix("WALKTHROUGH "))
    state, sampler = walk["paths"]
    assert walk["loss_after"] < walk["loss_before"]
    assert walk["sampled"] == [3, 3]
    assert state in walk["listed"] and sampler in walk["listed"]
    assert walk["weights_info"] == ["tiny", 4]
    assert walk["left"] == [[sampler, True]]  # the state deleted, the sampler published
    assert walk["sessions"] >= 1
