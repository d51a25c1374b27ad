"""Step observers: told of every train step and log call, without the model knowing what they are."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group


class Recorder:
    """An observer that writes down what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def step_metrics(self, model: Any) -> Mapping[str, float]:
        return {"recorder/steps_seen": float(len(self.events))}

    def step_started(self, model, groups, *, split, step, options):  # type: ignore[no-untyped-def]
        self.events.append(("started", (split, step, len(groups), dict(options))))
        return lambda result: self.events.append(("finished", result))


async def test_an_observer_sees_each_step_start_and_finish_with_its_result(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    recorder = Recorder()
    model.observers.append(recorder)
    groups = varied_group(await groups_for(model, ["What is 1 + 2?", "What is 3 + 4?"]))

    result = await model.train(groups, learning_rate=1e-4, langfuse=False)
    await model.log(groups, split="val", langfuse=False)

    assert recorder.events[0] == ("started", ("train", 0, 2, {"langfuse": False}))
    assert recorder.events[1] == ("finished", result)
    assert recorder.events[2] == ("started", ("val", result.step, 2, {"langfuse": False}))
    assert recorder.events[3] == ("finished", None)
    # What an observer counts between steps is reported with the next step.
    second = await model.train(groups, langfuse=False)
    assert second.metrics["recorder/steps_seen"] == 4.0


async def test_a_failed_step_finishes_its_observers_without_a_result(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    recorder = Recorder()
    model.observers = [recorder]
    with pytest.raises(art.BackendRequestError):
        await model.train([], langfuse=False)  # no groups: the server refuses the step
    assert [kind for kind, _ in recorder.events] == ["started", "finished"]
    assert recorder.events[1] == ("finished", None)
