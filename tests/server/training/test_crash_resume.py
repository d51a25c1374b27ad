"""Kill the backend process in the middle of a training step: nothing on disk is corrupted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

import art_core as art
from art_backend.testing import read_trajectories
from tests.support.rollouts import groups_for, varied_group

QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]
COMMITTED = ("before_trajectories", "before_history")  # points after step 2's checkpoint rename


def adam_state(checkpoint: Path):
    import torch

    return torch.load(checkpoint / "trainer_state.pt", weights_only=True)["optimizer"]


@pytest.mark.parametrize(
    "pause_at", ["before_checkpoint", "before_rename", "before_trajectories", "before_history"]
)
async def test_sigkill_mid_step_resumes_from_the_last_complete_step(
    pause_at: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    model = art.TrainableModel(name="crashy", project="p", base_model=str(tiny_model_dir))
    first = art.LocalBackend(path=tmp_path, dtype="float32")
    await model.register(first)
    await model.train(varied_group(await groups_for(model, QUESTIONS)))  # step 1, complete
    groups = varied_group(await groups_for(model, QUESTIONS))
    await first.close()

    # Same folder, a backend that pauses inside the next step's commit; kill it there.
    monkeypatch.setenv("ART_FAULT_PAUSE", f"{pause_at}:60")
    second = art.LocalBackend(path=tmp_path, dtype="float32")
    await model.register(second)
    assert model.step == 1
    groups = varied_group(await groups_for(model, QUESTIONS))
    training = asyncio.create_task(model.train(groups))
    log = tmp_path / "p/models/crashy"
    for _ in range(600):  # wait until the step reaches the pause point
        await asyncio.sleep(0.05)
        tmp_dirs = list((log / "checkpoints").glob(".tmp-*"))
        if pause_at in COMMITTED and (log / "checkpoints/0002").exists():
            break
        if pause_at not in COMMITTED and tmp_dirs:
            break
    await asyncio.sleep(0.3)
    assert second.process is not None
    os.kill(second.process.pid, signal.SIGKILL)
    with pytest.raises(art.BackendCrashedError):
        await training
    await second.close()

    # Restart: the last complete checkpoint loads and history agrees with it.
    monkeypatch.delenv("ART_FAULT_PAUSE")
    third = art.LocalBackend(path=tmp_path, dtype="float32")
    await model.register(third)
    expected = 2 if pause_at in COMMITTED else 1  # step 2 was complete on disk
    assert model.step == expected
    assert not list((log / "checkpoints").glob(".tmp-*"))
    history = [json.loads(line) for line in (log / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history if row["type"] == "train"] == list(
        range(1, expected + 1)
    )
    before = adam_state(log / f"checkpoints/{expected:04d}")
    assert before["state"]  # the optimizer state was saved and comes back with the adapter
    # Every trained step's rollouts are logged once, also those of a step the crash interrupted.
    for sampled_at in range(expected):
        logged = read_trajectories(log / f"trajectories/train/{sampled_at:04d}.jsonl.gz")
        assert (
            len(logged) == len({row["id"] for row in logged}) == 4 * len(QUESTIONS)
        )  # 4 rollouts a group

    result = await model.train(varied_group(await groups_for(model, QUESTIONS)))
    assert result.step == expected + 1
    await third.close()
