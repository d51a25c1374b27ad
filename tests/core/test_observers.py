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
    recorder = Recorder()
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=[recorder])
    assert model.observers == [recorder]
    groups = varied_group(await groups_for(model, ["What is 1 + 2?", "What is 3 + 4?"]))

    result = await model.train(groups, learning_rate=1e-4)
    await model.log(groups, split="val")

    assert recorder.events[0] == ("started", ("train", 0, 2, {}))
    assert recorder.events[1] == ("finished", result)
    assert recorder.events[2] == ("started", ("val", result.step, 2, {}))
    assert recorder.events[3] == ("finished", None)
    # What an observer counts between steps is reported with the next step; ART's form,
    # backend.train(model, ...), is observed the same way and moves the model's step.
    second = await remote_backend.train(model, groups)
    assert second.metrics["recorder/steps_seen"] == 4.0
    assert recorder.events[4] == ("started", ("train", result.step, 2, {}))
    assert model.step == second.step == result.step + 1


async def test_a_failed_step_finishes_its_observers_without_a_result(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=[])
    recorder = Recorder()
    model.observers = [recorder]
    model.pending_metrics["client/counted"] += 2
    with pytest.raises(art.BackendRequestError):
        await model.train([])  # no groups: the server refuses the step
    assert [kind for kind, _ in recorder.events] == ["started", "finished"]
    assert recorder.events[1] == ("finished", None)
    # The counts that step did not report wait for the next one.
    assert model.pending_metrics["client/counted"] == 2
    assert model.step == 0


def test_report_metrics_names_installed_trackers_and_refuses_the_rest(
    monkeypatch: pytest.MonkeyPatch,
):
    from art_core.trackers import tracker_names
    from art_core.trackers.langfuse import LangfuseObserver

    assert "langfuse" in tracker_names()
    default = art.TrainableModel(name="m", base_model="x")
    assert [type(o) for o in default.observers] == [LangfuseObserver]
    assert art.TrainableModel(name="m", base_model="x", report_metrics=[]).observers == []
    with pytest.raises(art.UnsupportedOptionError, match=r"no tracker named 'nope'.*langfuse"):
        art.TrainableModel(name="m", base_model="x", report_metrics=["nope"])
    with pytest.raises(art.UnsupportedOptionError, match=r"give a list"):
        art.TrainableModel(name="m", base_model="x", report_metrics="langfuse")  # type: ignore[arg-type]
    with pytest.raises(art.UnsupportedOptionError, match="neither a tracker name"):
        art.TrainableModel(name="m", base_model="x", report_metrics=[object()])  # type: ignore[list-item]
    # Named, a tracker must be able to run: without its settings that is an error now.
    for variable in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises((art.LangfuseConfigError, art.LangfuseNotInstalledError)):
        art.TrainableModel(name="m", base_model="x", report_metrics=["langfuse"])


def test_the_tracker_registry_reads_the_entry_points_only(monkeypatch: pytest.MonkeyPatch):
    """pyproject's entry points name our trackers too: without them, none is installed here."""
    import tomllib
    from importlib.metadata import EntryPoint

    import art_core.trackers as trackers

    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    ours = declared["project"]["entry-points"][trackers.ENTRY_POINT_GROUP]
    assert trackers.tracker_names() == sorted(ours)

    only = [EntryPoint("recorder", f"{__name__}:Recorder", trackers.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(trackers, "entry_points", lambda group: only if group else [])
    trackers._installed.cache_clear()
    try:
        assert trackers.tracker_names() == ["recorder"]
        assert trackers.observers_for(None) == []  # the defaults are absent, not an error
        with pytest.raises(art.UnsupportedOptionError, match=r"'langfuse'.*installed: recorder"):
            trackers.observers_for(["langfuse"])
    finally:
        trackers._installed.cache_clear()


async def test_langfuse_on_a_call_still_works_and_says_it_is_deprecated(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    recorder = Recorder()
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=[recorder])
    groups = varied_group(await groups_for(model, ["What is 1 + 2?"]))
    with pytest.deprecated_call(match="report_metrics"):
        await model.log(groups, split="val", langfuse=False)
    assert recorder.events[0] == ("started", ("val", 0, 1, {"langfuse": False}))
