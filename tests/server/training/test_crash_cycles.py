"""SIGKILL the real backend at random moments, many times: every restart finds a sound store.

Each cycle starts `art-server` (LocalBackend, tiny model) on the same `--path`, registers the
model, and then keeps rolling out, logging and training until the process is killed: at a random
moment, or at a random moment inside a `train` call. After every restart the store must be
whole: the latest checkpoint loads and is served, history reads and its steps never go back,
every trained step's rollouts are logged once, every trajectories file reads without damage,
and the next step is N+1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import time
from pathlib import Path

import httpx
import openai
import pytest

import art_core as art
from art_backend.testing import read_trajectory_file
from tests.support.rollouts import groups_for, varied_group

CYCLES = 20
SEED = 1212
QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]
ROLLOUTS_PER_STEP = 4 * len(QUESTIONS)  # groups_for samples 4 answers a question


class Progress:
    """What the client saw of the work it sends: acknowledged steps, and whether a train runs."""

    def __init__(self) -> None:
        self.acknowledged = 0
        self.in_train = False
        self.train_seconds: list[float] = []


async def keep_working(model: art.TrainableModel, progress: Progress) -> None:
    """Roll out, log an evaluation, train; again and again (until the backend dies)."""
    while True:
        groups = varied_group(await groups_for(model, QUESTIONS))
        await model.log(groups, split="val")
        before, started = model.step, time.monotonic()
        progress.in_train = True
        try:
            result = await model.train(groups)
        finally:
            progress.in_train = False
        assert result.step == before + 1  # step N+1 follows step N
        progress.acknowledged = result.step
        progress.train_seconds.append(time.monotonic() - started)


def check_store(art_path: Path, model: art.TrainableModel, progress: Progress) -> None:
    """Everything a restart must find after a kill at any moment."""
    folder = art_path / model.project / "models" / model.name
    checkpoints = sorted(
        int(path.name) for path in (folder / "checkpoints").iterdir() if path.name.isdigit()
    )
    assert model.step == checkpoints[-1] >= progress.acknowledged  # no acknowledged step lost
    assert not list(folder.glob("checkpoints/.tmp-*"))
    assert not list(folder.glob("trajectories/*/.tmp-*"))

    history = folder / "history.jsonl"
    lines = history.read_text().splitlines() if history.exists() else []
    rows = [json.loads(line) for line in lines]  # every line whole: a torn one was repaired
    steps = [row["step"] for row in rows]
    assert steps == sorted(steps)  # monotone
    assert [row["step"] for row in rows if row["type"] == "train"] == list(range(1, model.step + 1))

    for path in folder.glob("trajectories/*/*.jsonl.gz"):
        content = read_trajectory_file(path)
        assert not content.damaged, (path, content.note())
    for step in range(1, model.step + 1):  # the rollouts each step trained on, logged once
        rows = read_trajectory_file(folder / f"trajectories/train/{step - 1:04d}.jsonl.gz").rows
        assert len({row["id"] for row in rows}) == len(rows) == ROLLOUTS_PER_STEP


@pytest.mark.slow
async def test_random_sigkills_never_break_the_store(tiny_model_dir: Path, tmp_path: Path):
    rng = random.Random(SEED)
    model = art.TrainableModel(name="cycles", project="p", base_model=str(tiny_model_dir))
    progress = Progress()
    kills_in_train = 0
    for cycle in range(CYCLES + 1):
        backend = art.LocalBackend(path=tmp_path, dtype="float32")
        await model.register(backend)
        check_store(tmp_path, model, progress)
        served = await model.openai_client().models.list()
        assert f"cycles@{model.step}" in {entry.id for entry in served.data}  # latest loads
        if cycle == CYCLES:  # the last restart: one more step, then a clean stop
            before = model.step
            assert (await model.train(varied_group(await groups_for(model, QUESTIONS)))).step == (
                before + 1
            )
            await backend.close()
            break

        work = asyncio.create_task(keep_working(model, progress))
        if rng.random() < 0.5:  # inside a train call: from its start to about its length
            while not progress.in_train and not work.done():
                await asyncio.sleep(0.01)
            typical = statistics.median(progress.train_seconds or [1.0])
            await asyncio.sleep(rng.uniform(0.0, typical * 1.2))
        else:  # anywhere in the roll out, log, train loop
            await asyncio.sleep(rng.uniform(0.0, 3.0))
        if work.done():
            work.result()  # it failed before the kill: a real error, raise it
        kills_in_train += progress.in_train
        assert backend.process is not None
        os.kill(backend.process.pid, signal.SIGKILL)
        # The client sees the crash (as a crashed backend or a lost connection), never a hang.
        with contextlib.suppress(art.ArtError, openai.OpenAIError, httpx.HTTPError):
            await asyncio.wait_for(work, timeout=60)
        await backend.close()

    assert kills_in_train >= CYCLES // 4  # the kills did land inside train calls
    assert progress.acknowledged >= 1
