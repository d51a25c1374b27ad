"""GroupSignal: scenarios that stay all-equal are skipped, steps are topped up with more groups
until enough carry signal, and every skip and extra group is counted in the step's metrics."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_core.pipeline_trainer import PipelineTrainer
from art_core.utils._signal import _HINTED, carries_signal, hint_zero_variance
from tests.support.models import fresh_model
from tests.support.rollouts import answer_rollout


def trajectory(reward: float) -> art.Trajectory:
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=reward)


async def scripted(reward: float, delay: float = 0.0) -> art.Trajectory:
    await asyncio.sleep(delay)
    return trajectory(reward)


def group_of(rewards: list[float]) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(trajectory(r) for r in rewards)


# ------------------------------------------------------------------------- the memory


def test_carries_signal_needs_two_different_rewards():
    assert carries_signal(group_of([0.0, 1.0]))
    assert not carries_signal(group_of([1.0, 1.0, 1.0]))
    assert not carries_signal(group_of([0.5]))
    assert not carries_signal(art.TrajectoryGroup([], exceptions=[RuntimeError("x")]))


def test_an_all_equal_scenario_is_skipped_1_2_4_times_then_tried_again():
    signal = art.GroupSignal(max_skips=4)
    turns: list[str] = []
    for _ in range(4):  # all-equal every time it is sampled
        while signal.skip("q"):
            turns.append("skip")
        turns.append("sample")
        signal.record("q", group_of([0.0, 0.0]))
    assert turns == ["sample", "skip", "sample", "skip", "skip", "sample"] + ["skip"] * 4 + [
        "sample"
    ]
    signal.record("q", group_of([0.0, 1.0]))  # it carries signal again: no more skips
    assert not signal.skip("q")
    metrics = signal.take_step_metrics()
    assert metrics["signal/skipped_scenarios"] == 7
    assert metrics["signal/zero_variance_groups"] == 4
    assert metrics["signal/trainable_groups"] == 1
    assert signal.take_step_metrics()["signal/skipped_scenarios"] == 0  # per step ...
    assert signal.take_step_metrics()["signal/cum/skipped_scenarios"] == 7  # ... and run totals


def test_skipping_can_be_turned_off_and_bad_settings_are_errors():
    signal = art.GroupSignal(skip_settled=False)
    signal.record("q", group_of([1.0, 1.0]))
    assert not signal.skip("q")
    with pytest.raises(ValueError, match="min_trainable_groups must be >= 1"):
        art.GroupSignal(min_trainable_groups=0)
    with pytest.raises(ValueError, match=r"max_groups_per_step .* must be >= min_trainable"):
        art.GroupSignal(min_trainable_groups=4, max_groups_per_step=2)
    with pytest.raises(ValueError, match="max_skips"):
        art.GroupSignal(max_skips=-1)


def test_scenarios_are_told_apart_by_value_json_or_a_key():
    signal = art.GroupSignal()
    signal.record({"q": 1}, group_of([1.0, 1.0]))  # a dict: by its JSON
    assert signal.skip({"q": 1}) and not signal.skip({"q": 2})
    with pytest.raises(TypeError, match=r"GroupSignal\(key="):
        signal.record({"q": object()}, group_of([1.0, 1.0]))
    keyed = art.GroupSignal(key=lambda scenario: scenario["id"])
    keyed.record({"id": 7, "tool": object()}, group_of([0.0, 0.0]))
    assert keyed.skip({"id": 7, "tool": object()})


# ------------------------------------------------------------------- iterate and gather


def test_without_records_the_signal_keeps_iterate_datasets_order():
    items = list(range(10))
    plain = [b.items for b in art.iterate_dataset(items, 3, num_epochs=2, use_tqdm=False)]
    signal = art.GroupSignal()
    signalled = [
        b.items for b in art.iterate_dataset(items, 3, num_epochs=2, use_tqdm=False, signal=signal)
    ]
    # The same order; without skips the partial last batch of an epoch is filled from the next.
    assert [i for b in signalled for i in b] == [i for b in plain for i in b]
    assert all(len(b) == 3 for b in signalled[:-1])


async def test_settled_items_are_passed_over_and_the_batch_still_fills():
    items = list(range(8))
    signal = art.GroupSignal()
    batches = art.iterate_dataset(items, 4, num_epochs=2, use_tqdm=False, signal=signal)
    first = next(batches)
    groups = await art.gather_trajectory_groups(
        first.groups(lambda i: group_of([1.0, 1.0] if i % 2 else [0.0, 1.0])), pbar_desc=None
    )
    assert len(groups) == 4 and groups.counts["signal/zero_variance_groups"] == 2
    later = [i for batch in batches for i in batch.items]
    settled = [i for i in first.items if i % 2]
    # Each settled item misses its next turn (epoch 2), the others come round again.
    assert all(later.count(i) == 0 for i in settled)
    assert sorted(set(later)) == sorted(set(items) - set(settled))


async def test_dynamic_sampling_replaces_all_equal_groups_until_enough_carry_signal():
    items = list(range(40))
    signal = art.GroupSignal(skip_settled=False, min_trainable_groups=4, max_groups_per_step=12)
    [batch] = [b for b in art.iterate_dataset(items, 4, use_tqdm=False, signal=signal)][:1]

    def make(i: int) -> art.TrajectoryGroup:  # every third item carries signal
        rewards = [0.0, 1.0] if i % 3 == 0 else [0.0, 0.0]
        return art.TrajectoryGroup(scripted(r, delay=0.001 * (i % 5)) for r in rewards)

    groups = await art.gather_trajectory_groups(batch.groups(make), pbar_desc=None)
    trainable = [g for g in groups if carries_signal(g)]
    assert len(trainable) == 4
    assert groups.counts["signal/extra_groups"] == len(groups) - 4 <= 8
    # The batch's own groups first, then the extra ones, in the order they were drawn.
    assert len(groups) <= 12


async def test_dynamic_sampling_stops_at_its_bound_and_counts_it():
    signal = art.GroupSignal(skip_settled=False, min_trainable_groups=3, max_groups_per_step=5)
    batch = next(art.iterate_dataset(list(range(30)), 2, use_tqdm=False, signal=signal))
    groups = await art.gather_trajectory_groups(
        batch.groups(lambda i: group_of([1.0, 1.0])), pbar_desc=None
    )
    assert len(groups) == 5 and groups.counts["signal/extra_groups"] == 3
    assert groups.counts["signal/trainable_groups"] == 0


async def test_drawn_items_are_not_given_again_by_the_next_batch():
    signal = art.GroupSignal(skip_settled=False, min_trainable_groups=2, max_groups_per_step=4)
    seen: list[int] = []
    for batch in art.iterate_dataset(list(range(12)), 2, use_tqdm=False, signal=signal):

        def make(i: int) -> art.TrajectoryGroup:
            seen.append(i)
            return group_of([0.0, 0.0] if i < 6 else [0.0, 1.0])

        await art.gather_trajectory_groups(batch.groups(make), pbar_desc=None)
    assert sorted(seen) == list(range(12))  # each item once, extra draws included


async def test_a_failing_group_is_dropped_counted_and_not_recorded():
    signal = art.GroupSignal(min_trainable_groups=1, max_groups_per_step=2)
    batch = next(art.iterate_dataset(["a", "b", "c"], 1, use_tqdm=False, signal=signal))

    async def make(item: str) -> art.TrajectoryGroup:
        if item == "a":
            raise ConnectionError("tool down")
        return group_of([0.0, 1.0])

    groups = await art.gather_trajectory_groups(
        batch.groups(make), pbar_desc=None, max_exceptions=1
    )
    assert groups.dropped == 1 and len(groups) == 1
    assert "a" not in signal.records


async def test_past_the_exception_limit_the_gather_raises_and_cancels_the_rest():
    signal = art.GroupSignal(min_trainable_groups=2)
    batch = next(art.iterate_dataset(["a", "b"], 2, use_tqdm=False, signal=signal))
    cancelled = asyncio.Event()

    async def slow() -> art.Trajectory:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return trajectory(0.0)

    async def fail() -> art.Trajectory:
        raise RuntimeError("boom")

    def make(item: str) -> art.TrajectoryGroup:
        return art.TrajectoryGroup([fail()] if item == "a" else [slow()])

    with pytest.raises(art.TooManyExceptionsError):
        await art.gather_trajectory_groups(batch.groups(make), pbar_desc=None)
    assert cancelled.is_set()


def test_batch_groups_needs_a_function_and_iterates_like_the_plain_generator():
    batch = next(art.iterate_dataset([1, 2], 2, use_tqdm=False))
    with pytest.raises(TypeError, match="make_group must be a function"):
        batch.groups([1, 2])  # type: ignore[arg-type]
    made = list(batch.groups(lambda i: group_of([float(i)])))
    assert [g.trajectories[0].reward for g in made] == [1.0, 2.0]


async def test_make_group_returning_something_else_is_a_type_error():
    batch = next(art.iterate_dataset([1], 1, use_tqdm=False, signal=art.GroupSignal()))
    with pytest.raises(TypeError, match=r"not an art\.TrajectoryGroup"):
        await art.gather_trajectory_groups(batch.groups(lambda i: i), pbar_desc=None)


# ---------------------------------------------------------------- the hint, the backend


def test_the_hint_warns_once_when_most_groups_are_all_equal(caplog):
    caplog.set_level(logging.WARNING, logger="art_core.signal")
    model = type("M", (), {"name": "hint-test-model"})()
    _HINTED.discard("hint-test-model")
    flat = {"groups/zero_variance": 6.0, "groups/trainable": 2.0}
    assert hint_zero_variance(model, flat, {})
    assert "6 of 8 groups" in caplog.text and "GroupSignal" in caplog.text
    assert not hint_zero_variance(model, flat, {})  # once
    _HINTED.discard("hint-test-model")
    assert not hint_zero_variance(model, flat, {"signal/groups": 8.0})
    assert not hint_zero_variance(model, {"groups/zero_variance": 1.0, "groups/trainable": 3.0}, {})


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


async def test_the_signals_counts_reach_the_trained_steps_metrics(model: art.TrainableModel):
    questions = [f"What is {i} + 1?" for i in range(12)]
    signal = art.GroupSignal(min_trainable_groups=2, max_groups_per_step=6)
    batch = next(art.iterate_dataset(questions, 2, use_tqdm=False, signal=signal))

    made: list[str] = []

    async def make(question: str) -> art.TrajectoryGroup:
        made.append(question)
        settled = len(made) <= 2  # the batch's own two groups are all-equal, the extra ones not
        group = await art.TrajectoryGroup(answer_rollout(model, question) for _ in range(2))
        for k, each in enumerate(group.trajectories):
            each.reward = 0.0 if settled else float(k)
        return group

    groups = await art.gather_trajectory_groups(batch.groups(make), pbar_desc=None)
    result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    assert len(groups) == 4 and made[:2] == batch.items
    assert result.metrics["signal/extra_groups"] == 2
    assert result.metrics["signal/trainable_groups"] == 2
    assert result.metrics["groups/trainable"] == 2


async def test_pipeline_trainer_skips_scenarios_whose_groups_were_all_equal(
    model: art.TrainableModel,
):
    sampled: list[str] = []

    async def rollout(model: art.TrainableModel, kind: str, config: Any) -> art.TrajectoryGroup:
        sampled.append(kind)
        group = await art.TrajectoryGroup(answer_rollout(model, "What is 2 + 2?") for _ in range(2))
        for k, each in enumerate(group.trajectories):
            each.reward = 1.0 if kind == "solved" else float(k)
        return group

    scenarios = ["solved", "open", "solved", "open", "solved", "open"]
    trainer = PipelineTrainer(
        model, model.backend, rollout, scenarios, config=None, signal=art.GroupSignal(),
        num_rollout_workers=1, min_batch_size=1, max_batch_size=1, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    # "solved" was all-equal once, so its next turn is skipped; then tried again.
    assert sampled == ["solved", "open", "open", "solved", "open"]
    rows = [row for row in await model.backend.history(model) if row["type"] == "train"]
    assert sum(row["metrics"]["signal/skipped_scenarios"] for row in rows) == 1
    with pytest.raises(TypeError, match=r"signal must be an art\.GroupSignal"):
        PipelineTrainer(model, model.backend, rollout, scenarios, config=None, signal=3)
