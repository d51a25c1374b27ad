"""The trainer honours the review page: flags and reward overrides apply to groups not yet trained.

Decisions are made the way a person makes them, by POSTing the review page's forms to the real
server; the trainer's step metrics count what they changed (`review/...`).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

import art_core as art
from art_backend.store._review_decisions import PendingStep, list_pending, write_pending
from art_backend.testing import read_trajectories
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer

QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]


def model_dir(server: RunningServer, model: art.TrainableModel) -> Path:
    return Path(server.art_path) / model.project / "models" / model.name


def decide(server: RunningServer, model: art.TrainableModel, where: str, **form: str) -> dict:
    """POST a review form, as the page does; returns the recorded decision."""
    response = httpx.post(
        f"{server.url}/review/{model.project}/{model.name}/steps/{where}/decisions",
        data=form,
        headers={"accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    return response.json()["decision"]


def logged_rows(server: RunningServer, model: art.TrainableModel, step: int) -> dict[str, dict]:
    path = model_dir(server, model) / "trajectories" / "train" / f"{step:04d}.jsonl.gz"
    return {row["id"]: row for row in read_trajectories(path) if "id" in row}


async def until_held(server: RunningServer, model: art.TrainableModel) -> PendingStep:
    for _ in range(1200):
        if held := list_pending(model_dir(server, model)):
            return held[0]
        await asyncio.sleep(0.05)
    raise AssertionError("the train request was never held for review")


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


async def test_trained_rows_keep_their_advantage_and_steps_count_review(
    model: art.TrainableModel, training_server: RunningServer
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    result = await model.train(groups)
    for key in ("review/flagged_trajectories", "review/flagged_groups", "review/reward_overrides"):
        assert result.metrics[key] == 0
    rows = logged_rows(training_server, model, 0)
    for group in groups:
        advantages = [rows[t.id]["advantage"] for t in group.trajectories]
        assert sum(advantages) == pytest.approx(0, abs=1e-6)
        assert advantages == sorted(advantages)  # rewards 0, 1, 2, 3: advantages rise with them


async def test_flags_and_overrides_apply_to_trajectories_submitted_again(
    model: art.TrainableModel, training_server: RunningServer
):
    groups = varied_group(await groups_for(model, ["q1", "q2", "q3"]))
    await model.log(groups, split="val")  # logged, so it can be reviewed before training
    flagged, overridden = groups[0].trajectories[0], groups[0].trajectories[1]
    decide(training_server, model, "val/0", action="flag_trajectory",
           trajectory_id=flagged.id, reason="gibberish")  # fmt: skip
    decide(training_server, model, "val/0", action="override_reward",
           trajectory_id=overridden.id, reward="10", reason="actually right")  # fmt: skip
    decide(training_server, model, "val/0", action="flag_group", group="1", reason="bad scenario")

    result = await model.train(groups)

    metrics = result.metrics
    assert metrics["review/flagged_trajectories"] == 1
    assert metrics["review/flagged_groups"] == 1
    assert metrics["review/reward_overrides"] == 1
    assert metrics["groups/submitted"] == 3 and metrics["groups/trainable"] == 2
    assert metrics["rows"] == 3 + 4  # group 0 without its flagged run, group 2; not group 1
    rows = logged_rows(training_server, model, 0)
    assert rows[flagged.id]["review"]["applied"] == "flagged_trajectories"
    assert "advantage" not in rows[flagged.id]
    assert rows[overridden.id]["reward"] == 10.0
    assert rows[overridden.id]["review"]["submitted_reward"] == 1.0
    assert rows[overridden.id]["advantage"] > 1  # the best of its group now
    assert all(rows[t.id]["review"]["applied"] == "flagged_groups" for t in groups[1])
    assert all("review" not in rows[t.id] for t in groups[2])


async def test_a_held_step_waits_for_approval_and_applies_flags_made_meanwhile(
    model: art.TrainableModel, training_server: RunningServer, caplog: pytest.LogCaptureFixture
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    config = art.TrainConfig(review_hold_seconds=600)
    with caplog.at_level(logging.WARNING, logger="art_core"):
        training = asyncio.create_task(model.train(groups, config=config))
        held = await until_held(training_server, model)
        assert (held.step, held.groups, held.trajectories) == (0, 2, 8)

        model_page = httpx.get(f"{training_server.url}/review/{model.project}/{model.name}/")
        assert f'data-pending="{held.id}"' in model_page.text and "Approve now" in model_page.text
        flagged = groups[1].trajectories[2]
        decide(training_server, model, f"_pending/{held.id}", action="flag_trajectory",
               trajectory_id=flagged.id, reason="looped")  # fmt: skip
        await asyncio.sleep(0.3)  # a poll of the hold passes: still held, nothing trained
        assert not training.done() and await model.get_step() == 0

        approve = httpx.post(
            f"{training_server.url}/review/{model.project}/{model.name}/pending/{held.id}/approve",
            data={"who": "ann"},
        )
        assert approve.status_code == 303
        result = await asyncio.wait_for(training, 120)

    assert result.step == 1
    assert result.metrics["review/flagged_trajectories"] == 1 and result.metrics["rows"] == 7
    assert logged_rows(training_server, model, 0)[flagged.id]["review"]["reason"] == "looped"
    assert list_pending(model_dir(training_server, model)) == []
    assert f"/review/{model.project}/{model.name}/steps/_pending/{held.id}" in caplog.text
    # The decision log now points at the step the held rollouts trained from.
    log = httpx.get(f"{training_server.url}/review/{model.project}/{model.name}/").text
    assert "train step 0</a> (was held)" in log and "looped" in log


async def test_a_hold_that_expires_trains_with_the_decisions_in_force(
    model: art.TrainableModel, training_server: RunningServer
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    result = await model.train(groups, config=art.TrainConfig(review_hold_seconds=0.2))
    assert result.step == 1 and result.metrics["review/flagged_trajectories"] == 0
    assert list_pending(model_dir(training_server, model)) == []


async def test_a_negative_hold_is_refused_on_the_client_and_on_the_server(
    model: art.TrainableModel, training_server: RunningServer
):
    with pytest.raises(ValidationError, match="review_hold_seconds"):
        art.TrainConfig(review_hold_seconds=-1)
    body = {
        "groups": [{"trajectories": [{"id": "a", "reward": 1}, {"id": "b", "reward": 0}]}],
        "config": {"review_hold_seconds": -1},
    }
    url = f"{training_server.url}/v1/training/models/{model.project}/{model.name}/train"
    response = httpx.post(url, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "config.review_hold_seconds"


async def test_holds_left_by_a_stopped_server_are_forgotten_at_registration(
    remote_backend: art.RemoteBackend, training_server: RunningServer, tiny_model_dir: Path
):
    model = art.TrainableModel(
        name=f"m-{uuid.uuid4().hex[:8]}", project="tests", base_model=str(tiny_model_dir)
    )
    write_pending(model_dir(training_server, model), step=0, hold_seconds=60, rows=[])
    info = await remote_backend.register(model)
    assert any("held for review" in repair for repair in info["repairs"])
    assert list_pending(model_dir(training_server, model)) == []


def test_the_review_example_runs(tiny_model_dir: Path, tmp_path: Path):
    """examples/review_hold.py end to end (LocalBackend, tiny model, a hold that expires)."""
    example = Path(__file__).resolve().parents[3] / "examples" / "review_hold.py"
    command = [
        sys.executable, str(example), "--steps", "1", "--hold", "0.2", "--groups", "2",
        "--rollouts", "2", "--model", str(tiny_model_dir), "--path", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "review page: http://127.0.0.1:" in result.stdout and "?key=" in result.stdout
    assert "'review/flagged_trajectories': 0.0" in result.stdout
