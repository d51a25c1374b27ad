"""W&B through the real wandb SDK, offline: what it wrote in the run's files is the verdict.

A model trained on the real server with `report_metrics=["wandb"]` and WANDB_MODE=offline: the
run's record log (`run-<id>.wandb`, W&B's own format, read below) holds the config, every step's
metrics by split with `training_step` as x-axis, and per step a table of trajectories (reward,
advantage, the exact messages). Only ART's whitelist of metrics reaches the run (canonical
keys, costs, the user's own) while the model's history keeps them all; the run's link goes into
that history as a "tracker" row, shown on the review page. A second model object for the same
run resumes the same id; an SDK that raises is one warning and a counter, and training goes on.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import art_core as art
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer

wandb = pytest.importorskip("wandb", reason="pip install 'art-trainer[wandb]' ([dev])")

from art_core.trackers.wandb import WandbObserver  # noqa: E402 - after the skip

QUESTIONS = ["What is 2 + 2?", "Name a colour."]


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """W&B offline, its files under this test's folder; no key, no network."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path / "wandb"


def wandb_records(run_file: Path) -> Iterator[Any]:
    """The records of a `.wandb` file: W&B's record log (a 7-byte header `:W&B` + magic +
    version, then LevelDB-style records in 32 KiB blocks), each a `Record` protobuf."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    offset, pending = 7, b""
    while offset + 7 <= len(data):
        left = 32768 - offset % 32768
        _, length, kind = (
            struct.unpack("<IHB", data[offset : offset + 7]) if left >= 7 else (0, 0, 0)
        )
        if left < 7 or (length == 0 and kind == 0):  # block padding
            offset += left
            continue
        if offset + 7 + length > len(data):
            return  # wandb-core is still writing this record: it is read on the next poll
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full, first | middle, last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_run(folder: Path) -> dict[str, Any]:
    """The run id, config and history rows an offline run folder holds."""
    (run_file,) = folder.glob("run-*.wandb")
    # wandb-core writes the file from its own process: the run is complete at its exit record.
    for _ in range(600):
        if any(r.WhichOneof("record_type") == "exit" for r in wandb_records(run_file)):
            break
        time.sleep(0.1)
    run: dict[str, Any] = {"id": None, "config": {}, "history": []}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["id"], run["name"] = record.run.run_id, record.run.display_name
            run["project"] = record.run.project
            run["config"].update(
                {i.key: json.loads(i.value_json) for i in record.run.config.update}
            )
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            run["history"].append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
            )
    return run


def run_folders(wandb_dir: Path) -> list[Path]:
    return sorted(wandb_dir.glob("offline-run-*"))


async def test_steps_and_evaluations_land_in_the_offline_run_by_split_with_their_tables(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, offline_wandb: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=["wandb"])
    (observer,) = model.observers
    assert isinstance(observer, WandbObserver)
    groups = varied_group(await groups_for(model, QUESTIONS, per_group=2))
    result = await model.train(groups)
    val = await model.log(groups[:1], split="val")
    await model.log(metrics={"custom": 3.0}, split="val")
    link = observer.run_link(model)
    observer.finish()

    assert link is not None and "wandb sync" in link and model.name in link
    (folder,) = run_folders(offline_wandb)
    run = read_run(folder)
    assert (run["id"], run["name"], run["project"]) == (model.name, model.name, "tests")
    assert run["config"]["base_model"] == str(tiny_model_dir)
    assert run["config"]["run_name"] == model.name and run["config"]["lora_config"]["r"] > 0
    train_row = next(row for row in run["history"] if "train/reward" in row)
    assert train_row["training_step"] == result.step == 1
    assert train_row["train/reward"] == pytest.approx(result.metrics["reward"])
    assert train_row["train/loss"] == pytest.approx(result.metrics["loss"])
    val_rows = [row for row in run["history"] if "val/reward" in row]
    assert [row["training_step"] for row in val_rows] == [val["step"]] == [1]
    assert any(row.get("val/custom") == 3.0 for row in run["history"])

    # The train table: every trajectory, its reward, its advantage and its exact messages.
    table_path = train_row["train/trajectories/path"]
    table = json.loads((folder / "files" / table_path).read_text())
    assert table["columns"] == ["group", "trajectory_id", "reward", "advantage", "messages"]
    by_id = {t.id: t for g in groups for t in g.trajectories}
    assert {row[1] for row in table["data"]} == set(by_id)
    for _, trajectory_id, reward, advantage, messages in table["data"]:
        assert reward == by_id[trajectory_id].reward
        assert advantage == pytest.approx(result.advantages[trajectory_id])
        assert json.loads(messages) == by_id[trajectory_id].messages()


async def test_only_arts_whitelist_reaches_wandb_while_the_history_keeps_every_metric(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, offline_wandb: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=["wandb"])
    groups = varied_group(await groups_for(model, QUESTIONS[:1], per_group=2))
    groups[0].metrics["judge_calls"] = 2.0  # the user's own group metric
    for trajectory in groups[0].trajectories:
        trajectory.metrics["correct"] = trajectory.reward  # and trajectory metric (in logs)
    await model.train(groups)
    await model.log(groups, split="val", metrics={"my_metric": 2.0, "costs/judge": 0.01})
    (observer,) = model.observers
    assert isinstance(observer, WandbObserver)
    observer.finish()

    history = await remote_backend.history(model)
    train_row = next(row for row in history if row["type"] == "train")
    val_row = next(row for row in history if row["type"] == "log")
    (folder,) = run_folders(offline_wandb)
    sent = {key for row in read_run(folder)["history"] for key in row}
    # Canonical keys, the user's metrics (a trajectory's, a log call's) and a cost: in both.
    for split, key in [("train", "reward"), ("train", "loss"), ("train", "judge_calls"),
                       ("val", "reward"), ("val", "correct"), ("val", "my_metric"),
                       ("val", "costs/judge")]:  # fmt: skip
        assert key in (train_row if split == "train" else val_row)["metrics"]
        assert f"{split}/{key}" in sent
    # The server's own internals: in the history only.
    assert "groups/submitted" in train_row["metrics"] and "train/groups/submitted" not in sent
    assert "trajectories" in val_row["metrics"] and "val/trajectories" not in sent


async def test_the_runs_link_reaches_the_models_history_and_its_review_page(
    remote_backend: art.RemoteBackend,
    training_server: RunningServer,
    tiny_model_dir: Path,
    offline_wandb: Path,
):
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=["wandb"])
    await model.train(varied_group(await groups_for(model, QUESTIONS[:1], per_group=2)))
    (observer,) = model.observers
    assert isinstance(observer, WandbObserver)
    link = observer.run_link(model)
    for _ in range(100):  # the row is sent beside the step, on the event loop
        rows = [row for row in await remote_backend.history(model) if row["type"] == "tracker"]
        if rows:
            break
        await asyncio.sleep(0.05)
    observer.finish()

    (row,) = rows
    assert (row["tracker"], row["run_id"], row["step"]) == ("wandb", model.name, 1)
    assert link is not None and "wandb sync" in link
    assert row.get("url") is None and row["how_to_open"] == link
    async with httpx.AsyncClient(base_url=training_server.url, timeout=30) as client:
        page = await client.get(
            f"/review/{model.project}/{model.name}/", headers=training_server.headers()
        )
    assert page.status_code == 200
    assert "Tracker runs" in page.text and html.escape(link) in page.text


async def test_a_second_model_object_with_the_run_name_resumes_the_same_run(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, offline_wandb: Path
):
    first = await fresh_model(
        remote_backend, tiny_model_dir, run_name="experiment-7", report_metrics=["wandb"]
    )
    await first.train(varied_group(await groups_for(first, QUESTIONS[:1], per_group=2)))
    first.observers[0].finish()  # the program ends

    again = art.TrainableModel(
        name=first.name,
        project=first.project,
        run_name="experiment-7",
        base_model=str(tiny_model_dir),
        report_metrics=["wandb"],
    )
    await again.register(remote_backend)  # resumes the model's checkpoint on the server
    result = await again.train(varied_group(await groups_for(again, QUESTIONS[:1], per_group=2)))
    again.observers[0].finish()

    runs = [read_run(folder) for folder in run_folders(offline_wandb)]
    assert [run["id"] for run in runs] == ["experiment-7", "experiment-7"]
    assert runs[1]["config"]["name"] == first.name  # served under its name, tracked as the run
    assert (
        [row["training_step"] for row in runs[1]["history"] if "train/reward" in row]
        == [result.step]
        == [2]
    )


async def test_an_sdk_that_raises_is_one_warning_and_a_counter_and_training_goes_on(
    remote_backend: art.RemoteBackend,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    def broken_init(**kwargs: Any) -> Any:
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(wandb, "init", broken_init)
    caplog.set_level(logging.WARNING)
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=["wandb"])
    first = await model.train(varied_group(await groups_for(model, QUESTIONS[:1], per_group=2)))
    await model.log(metrics={"custom": 1.0})
    second = await model.train(varied_group(await groups_for(model, QUESTIONS[:1], per_group=2)))

    assert (first.step, second.step) == (1, 2)
    assert "wandb/failed_calls" not in first.metrics
    assert second.metrics["wandb/failed_calls"] == 2.0  # the first step's and the log's
    warnings = [r for r in caplog.records if r.name == "art_core.trackers"]
    assert len(warnings) == 1 and "W&B is down" in warnings[0].getMessage()


def test_wandb_is_a_default_tracker_only_with_an_api_key(monkeypatch: pytest.MonkeyPatch):
    assert not any(
        isinstance(o, WandbObserver) for o in art.TrainableModel(name="m", base_model="x").observers
    )
    monkeypatch.setenv("WANDB_API_KEY", "local-0000")
    observers = art.TrainableModel(name="m", base_model="x").observers
    assert any(isinstance(o, WandbObserver) for o in observers)
    assert art.TrainableModel(name="m", base_model="x", report_metrics=[]).observers == []
