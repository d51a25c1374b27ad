"""Trackio through the real trackio SDK, local: its SQLite store and its own dashboard are the verdict.

Training runs in a child program (Trackio reads TRACKIO_DIR once, at import) against the
session's real server, with `report_metrics=["trackio"]`; the test then reads what the SDK wrote
in the project's database (metrics by split at each step, the config, the trajectories as
traces with reward, advantage and the exact messages), resumes the run from a second program
(same run id), and opens `trackio show` in Debian's chromium to see the run's curve.

trackio needs pillow<13, which the main lock refuses, so every program that imports it (the
training programs, `trackio show`) runs on a second interpreter: ART_TRACKIO_PYTHON, which
`make test` builds as .venv/trackio (the client and the SDK, locked by
requirements/constraints-trackio.txt). This process never imports trackio.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.browser import screenshot_for_docs
from tests.support.servers import RunningServer

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
BUILT_TRACKIO_PYTHON = ROOT / ".venv" / "trackio" / "bin" / "python"


@pytest.fixture(scope="module")
def trackio_python() -> str:
    """The interpreter with trackio: ART_TRACKIO_PYTHON when named (a broken one fails, not
    skips), else .venv/trackio when built, else this one when trackio is installed here."""
    named = os.environ.get("ART_TRACKIO_PYTHON")
    if named:
        return named
    if BUILT_TRACKIO_PYTHON.exists():
        return str(BUILT_TRACKIO_PYTHON)
    if importlib.util.find_spec("trackio") is not None:
        return sys.executable
    pytest.skip(
        "no interpreter with trackio: `make .venv/.installed-trackio` builds .venv/trackio "
        "(or set ART_TRACKIO_PYTHON, or pip install 'art-trainer[trackio]' here)"
    )


# One training program: a step and an evaluation, tracked in Trackio; prints what it trained.
TRAIN = """
import asyncio, json, sys
import art_core as art
from tests.support.rollouts import groups_for, varied_group

async def main(url, base_model, name, run_name):
    backend = art.RemoteBackend(url)
    model = art.TrainableModel(name=name, project="tests", run_name=run_name,
                               base_model=base_model, report_metrics=["trackio"])
    await model.register(backend)
    groups = varied_group(await groups_for(model, ["What is 2 + 2?", "Name a colour."], per_group=2))
    result = await model.train(groups)
    val = await model.log(groups[:1], split="val")
    print("RESULT " + json.dumps({
        "step": result.step, "val_step": val["step"], "metrics": result.metrics,
        "advantages": result.advantages, "link": model.observers[0].run_link(model),
        "trajectories": {t.id: {"reward": t.reward, "messages": t.messages()}
                         for g in groups for t in g.trajectories},
    }))
    model.observers[0].finish()
    await backend.close()

asyncio.run(main(*sys.argv[1:]))
"""


# Two steps while trackio.init raises: what training returned and what the tracker warned.
BROKEN_SDK = """
import asyncio, json, logging, sys
import trackio
import art_core as art
from tests.support.rollouts import groups_for, varied_group

def broken_init(**kwargs):
    raise RuntimeError("Trackio's store is unwritable")

trackio.init = broken_init
warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("art_core.trackers").addHandler(handler)

async def main(url, base_model, name):
    backend = art.RemoteBackend(url)
    model = art.TrainableModel(name=name, project="tests", base_model=base_model,
                               report_metrics=["trackio"])
    await model.register(backend)
    results = [await model.train(varied_group(
        await groups_for(model, ["What is 1 + 1?"], per_group=2))) for _ in range(2)]
    print("RESULT " + json.dumps({"steps": [r.step for r in results],
                                  "metrics": results[-1].metrics, "warnings": warnings}))
    await backend.close()

asyncio.run(main(*sys.argv[1:]))
"""

# Which observers a model gets with and without naming Trackio.
OBSERVERS = """
import json
import art_core as art

def observers(**options):
    model = art.TrainableModel(name="m", base_model="x", **options)
    return [f"{type(o).__module__}.{type(o).__name__}" for o in model.observers]

print("RESULT " + json.dumps({"default": observers(),
                              "named": observers(report_metrics=["trackio"])}))
"""


def run_a_program(python: str, program: str, *args: str, trackio_dir: Path) -> dict[str, Any]:
    """Runs `program` on the trackio interpreter from the repo root; returns its RESULT line."""
    environment = {**os.environ, "TRACKIO_DIR": str(trackio_dir)}
    done = subprocess.run(
        [python, "-c", program, *args],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def train_in_a_program(
    python: str,
    server: RunningServer,
    tiny_model_dir: Path,
    trackio_dir: Path,
    name: str,
    run_name: str,
) -> dict[str, Any]:
    return run_a_program(
        python, TRAIN, server.url, str(tiny_model_dir), name, run_name, trackio_dir=trackio_dir
    )


def database_rows(trackio_dir: Path, table: str) -> list[dict[str, Any]]:
    with sqlite3.connect(trackio_dir / "tests.db") as connection:
        connection.row_factory = sqlite3.Row
        return [dict(row) for row in connection.execute(f"SELECT * FROM {table} ORDER BY rowid")]


def as_json(value: bytes | str) -> Any:
    return json.loads(value.decode() if isinstance(value, bytes) else value)


@pytest.fixture
def trackio_dir(tmp_path: Path) -> Path:
    return tmp_path / "trackio"


async def test_a_step_and_an_evaluation_land_in_trackios_store_and_a_second_program_resumes_the_run(
    trackio_python: str,
    training_server: RunningServer,
    tiny_model_dir: Path,
    trackio_dir: Path,
    tmp_path: Path,
):
    name = f"m-trackio-{tmp_path.name[-8:]}".replace("_", "-")
    same_run = (trackio_python, training_server, tiny_model_dir, trackio_dir, name, "curve-1")
    first = train_in_a_program(*same_run)
    assert "trackio show --project tests" in first["link"]

    metrics = database_rows(trackio_dir, "metrics")
    train = next(row for row in metrics if "train/reward" in as_json(row["metrics"]))
    assert (train["run_name"], train["step"]) == ("curve-1", first["step"]) == ("curve-1", 1)
    logged = as_json(train["metrics"])
    assert logged["train/reward"] == pytest.approx(first["metrics"]["reward"])
    assert logged["train/loss"] == pytest.approx(first["metrics"]["loss"])
    val = next(row for row in metrics if "val/reward" in as_json(row["metrics"]))
    assert val["step"] == first["val_step"]
    (config,) = database_rows(trackio_dir, "configs")
    assert as_json(config["config"])["base_model"] == str(tiny_model_dir)
    assert as_json(config["config"])["name"] == name

    traces = [
        row for row in database_rows(trackio_dir, "traces") if row["key"] == "train/trajectories"
    ]
    assert len(traces) == len(first["trajectories"]) == 4
    for trace in traces:
        metadata = as_json(trace["metadata"])
        trained = first["trajectories"][metadata["trajectory_id"]]
        assert metadata["reward"] == trained["reward"] and trace["step"] == 1
        assert metadata["advantage"] == pytest.approx(
            first["advantages"][metadata["trajectory_id"]]
        )
        assert as_json(trace["messages"]) == trained["messages"]

    # The program ends; a second one with the same model and run name continues the same run.
    second = train_in_a_program(*same_run)
    assert second["step"] == 2
    run_ids = {row["run_id"] for row in database_rows(trackio_dir, "metrics")}
    assert len(run_ids) == 1 and train["run_id"] in run_ids
    steps = sorted(
        row["step"] for row in database_rows(trackio_dir, "metrics")
        if "train/reward" in as_json(row["metrics"])
    )  # fmt: skip
    assert steps == [1, 2]

    if CHROMIUM.exists():
        await see_the_curve_in_trackios_dashboard(trackio_python, trackio_dir, "curve-1", tmp_path)


async def see_the_curve_in_trackios_dashboard(
    trackio_python: str, trackio_dir: Path, run_name: str, tmp_path: Path
) -> None:
    """`trackio show` on 127.0.0.1 (offline: its frontend ships in the wheel), in chromium."""
    async_api = pytest.importorskip("playwright.async_api", reason="pip install playwright")
    from tests.server.review.test_review_browser import CHROMIUM_ARGS

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {
        **os.environ, "TRACKIO_DIR": str(trackio_dir), "GRADIO_SERVER_PORT": str(port),
        "BROWSER": "true",  # `trackio show` opens a browser: ours is driven below
    }  # fmt: skip
    show = subprocess.Popen(
        [trackio_python, "-m", "trackio.cli", "show", "--project", "tests", "--host", "127.0.0.1"],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/?project=tests"
        for _ in range(600):
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        async with async_api.async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
            )
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(60_000)
                await page.goto(url)
                await page.get_by_text(run_name).first.wait_for()
                # The metric filter keeps the reward curves; a plot is titled without its split.
                await page.get_by_placeholder("e.g., loss").fill("^(train|val)/reward$")
                await page.get_by_text("train (1)").wait_for()
                await page.get_by_text("val (1)").wait_for()
                await page.get_by_text("reward", exact=True).first.wait_for()
                await page.wait_for_timeout(1500)  # the plots draw after their data arrives
                # docs/trackio.png only when missing or ART_UPDATE_SCREENSHOTS is set.
                await screenshot_for_docs(page, tmp_path / "trackio.png", "trackio.png")
            finally:
                await browser.close()
    finally:
        show.terminate()
        show.wait(timeout=30)


async def test_an_sdk_that_raises_is_one_warning_and_a_counter_and_training_goes_on(
    trackio_python: str,
    training_server: RunningServer,
    tiny_model_dir: Path,
    trackio_dir: Path,
    tmp_path: Path,
):
    name = f"m-broken-{tmp_path.name[-8:]}".replace("_", "-")
    ran = run_a_program(
        trackio_python, BROKEN_SDK, training_server.url, str(tiny_model_dir), name,
        trackio_dir=trackio_dir,
    )  # fmt: skip

    assert ran["steps"] == [1, 2]
    assert ran["metrics"]["trackio/failed_calls"] == 1.0
    assert len(ran["warnings"]) == 1 and "unwritable" in ran["warnings"][0]


def test_trackio_is_on_only_when_named(trackio_python: str, trackio_dir: Path):
    observers = run_a_program(trackio_python, OBSERVERS, trackio_dir=trackio_dir)

    trackio_observer = "art_core.trackers.trackio._observer.TrackioObserver"
    assert trackio_observer not in observers["default"]
    assert observers["named"] == [trackio_observer]
