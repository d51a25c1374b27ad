"""PipelineTrainer: rollout workers sample while the trainer trains (tiny model, real server).

Timing never decides an outcome here: where the order matters, the rollouts wait on events the
test sets from what the trainer has done (its step, the queue's depth).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_core.pipeline_trainer import (
    CheckpointInfo,
    CheckpointRetentionContext,
    PipelineRuntimeConfig,
    PipelineTrainer,
    keep_recent_and_top,
    make_group_rollout_fn,
)
from tests.support.models import fresh_model
from tests.support.rollouts import answer_rollout

QUESTIONS = [f"What is {i} + {i}?" for i in range(40)]


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


async def varied_group(
    model: art.TrainableModel, question: str, size: int = 2
) -> art.TrajectoryGroup:
    """Real sampled answers with rewards 0, 1, ... so that the group trains."""
    group = art.TrajectoryGroup(answer_rollout(model, question) for _ in range(size))
    [group] = await art.gather_trajectory_groups([group], pbar_desc=None)
    for index, trajectory in enumerate(group.trajectories):
        trajectory.reward = float(index)
    return group


async def varied_rollout(
    model: art.TrainableModel, question: str, config: Any
) -> art.TrajectoryGroup:
    return await varied_group(model, question)


async def train_rows(model: art.TrainableModel) -> list[dict[str, Any]]:
    return [row for row in await model.backend.history(model) if row["type"] == "train"]


def worker_tasks() -> list[asyncio.Task]:
    return [task for task in asyncio.all_tasks() if task.get_name().startswith("rollout_worker")]


async def wait_until(condition) -> None:
    """Poll a condition of the pipeline's state (the outcome never depends on how long)."""
    while not condition():
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------ end to end


async def test_trains_steps_end_to_end_and_evaluates_every_n_steps(model: art.TrainableModel):
    evaluated: list[tuple[int, int]] = []

    async def evaluate(model: art.TrainableModel, step: int, config: Any) -> list[art.Trajectory]:
        evaluated.append((step, model.step))
        return [await answer_rollout(model, "What is 1 + 1?", lambda text: 0.5)]

    trainer = PipelineTrainer(
        model, model.backend, varied_rollout, QUESTIONS, config=None, eval_fn=evaluate,
        num_rollout_workers=2, min_batch_size=2, max_batch_size=2, max_steps=4,
        eval_every_n_steps=2, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()

    assert model.step == 4 and await model.get_step() == 4
    assert trainer.state.accepted_trainable_groups == 8
    # Evaluated at the start and every 2 steps, each time while that step was served.
    assert evaluated == [(0, 0), (2, 2), (4, 4)]
    logged = [row for row in await model.backend.history(model) if row.get("split") == "val"]
    assert [row["step"] for row in logged] == [0, 2, 4]
    assert all(row["metrics"]["reward"] == 0.5 for row in logged)
    rows = await train_rows(model)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        assert row["metrics"]["groups/trainable"] == 2
        assert row["metrics"]["discarded/step/stale_groups"] == 0
        assert row["metrics"]["offpolicy/policy_age_steps_max"] >= 0
    assert worker_tasks() == []


async def test_scenarios_running_out_trains_the_last_partial_batch_and_ends(
    model: art.TrainableModel,
):
    trainer = PipelineTrainer(
        model, model.backend, varied_rollout, QUESTIONS[:3], config=None,
        num_rollout_workers=2, min_batch_size=2, max_batch_size=2, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    assert model.step == 2  # 2 groups, then the third alone
    assert trainer.state.total_scenarios_consumed == 3
    assert [row["metrics"]["groups/trainable"] for row in await train_rows(model)] == [2, 1]


# ------------------------------------------------------------------------------- staleness


async def test_groups_older_than_max_steps_off_policy_are_dropped_and_counted(
    model: art.TrainableModel,
):
    # Three groups are sampled at step 0 and queued together. The trainer trains one (0 -> 1);
    # with max_steps_off_policy=0 the other two are too old for step 1 -> 2: dropped, counted.
    # The next scenario is only handed out once step 1 is served, so its group is fresh.
    finished, all_finished = 0, asyncio.Event()
    trainer: PipelineTrainer

    async def rollout(model: art.TrainableModel, index: int, config: Any) -> art.TrajectoryGroup:
        nonlocal finished
        group = await varied_group(model, QUESTIONS[index])
        if index < 3:
            finished += 1
            if finished == 3:
                all_finished.set()
            await all_finished.wait()
        return group

    async def scenarios() -> AsyncIterator[int]:
        for index in range(3):
            yield index
        await wait_until(lambda: trainer.state.policy_version >= 1)
        for index in range(3, len(QUESTIONS)):
            yield index

    trainer = PipelineTrainer(
        model, model.backend, rollout, scenarios(), config=None,
        num_rollout_workers=3, min_batch_size=1, max_batch_size=1, queue_maxsize=4,
        max_steps_off_policy=0, max_steps=2, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()

    assert model.step == 2
    assert trainer.state.discarded_stale_groups == 2
    rows = await train_rows(model)
    assert [row["metrics"]["discarded/step/stale_groups"] for row in rows] == [0, 2]
    assert rows[1]["metrics"]["discarded/cum/stale_groups"] == 2
    assert rows[1]["metrics"]["offpolicy/policy_age_steps_max"] == 0  # the fresh group


async def test_a_group_within_max_steps_off_policy_trains(model: art.TrainableModel):
    # Same setup with max_steps_off_policy=1: the step-0 groups are still good at step 1.
    finished, all_finished = 0, asyncio.Event()

    async def rollout(model: art.TrainableModel, index: int, config: Any) -> art.TrajectoryGroup:
        nonlocal finished
        group = await varied_group(model, QUESTIONS[index])
        finished += 1
        if finished == 3:
            all_finished.set()
        await all_finished.wait()
        return group

    trainer = PipelineTrainer(
        model, model.backend, rollout, range(3), config=None,
        num_rollout_workers=3, min_batch_size=1, max_batch_size=1, queue_maxsize=4,
        max_steps_off_policy=1, max_steps=2, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    assert trainer.state.discarded_stale_groups == 0
    rows = await train_rows(model)
    assert rows[1]["metrics"]["offpolicy/policy_age_steps_max"] == 1


# ------------------------------------------------------------------------- the queue's bound


async def test_a_full_queue_makes_the_workers_wait(model: art.TrainableModel):
    started = 0
    seen: dict[str, int] = {}
    trainer: PipelineTrainer

    async def rollout(model: art.TrainableModel, question: str, config: Any) -> art.TrajectoryGroup:
        nonlocal started
        started += 1
        return await varied_group(model, question)

    async def evaluate(model: art.TrainableModel, step: int, config: Any) -> None:
        # Runs before the first step, with the workers going: 2 groups fill the queue, and
        # each of the 2 workers holds one more, waiting to put it.
        await wait_until(lambda: started == 4 and trainer._queue.full())
        for _ in range(5):  # real round trips: time for a worker that did not wait to go on
            await model.get_step()
        seen.update(started=started, depth=trainer._queue.qsize())

    trainer = PipelineTrainer(
        model, model.backend, rollout, QUESTIONS, config=None, eval_fn=evaluate,
        num_rollout_workers=2, min_batch_size=1, max_batch_size=1, queue_maxsize=2,
        max_steps=1, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    assert seen == {"started": 4, "depth": 2}
    assert trainer.state.max_queue_depth == 2
    assert model.step == 1


# ----------------------------------------------------------------- what is dropped is counted


async def test_failed_rollouts_and_zero_variance_groups_are_counted(model: art.TrainableModel):
    async def rollout(model: art.TrainableModel, kind: str, config: Any) -> art.TrajectoryGroup:
        if kind == "raise":
            raise ConnectionError("the agent's tool is down")
        group = await varied_group(model, "What is 2 + 2?")
        if kind == "flat":
            for trajectory in group.trajectories:
                trajectory.reward = 1.0
        return group

    trainer = PipelineTrainer(
        model, model.backend, rollout, ["raise", "flat", "raise", "good", "good"], config=None,
        num_rollout_workers=1, min_batch_size=1, max_batch_size=1, max_steps=1,
        learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()

    assert model.step == 1
    assert trainer.state.failed_rollouts == 2
    assert trainer.state.discarded_zero_variance_groups == 1
    [row] = await train_rows(model)
    assert row["metrics"]["discarded/step/failed_rollouts"] == 2
    assert row["metrics"]["discarded/step/zero_variance_groups"] == 1
    # ART keeps the dropped groups for inspection, under the split "discarded".
    history = await model.backend.history(model)
    assert [row["split"] for row in history if row["type"] == "log"] == ["discarded"]


async def test_a_group_rollout_keeps_a_failed_rollout_on_the_group(model: art.TrainableModel):
    calls = 0

    async def single(model: art.TrainableModel, question: str, config: Any) -> art.Trajectory:
        nonlocal calls
        calls += 1
        call = calls
        if call % 3 == 0:
            raise ValueError("bad answer format")
        return await answer_rollout(model, question, lambda text: float(call))

    trainer = PipelineTrainer(
        model, model.backend, make_group_rollout_fn(single, n=3), QUESTIONS, config=None,
        num_rollout_workers=1, min_batch_size=1, max_batch_size=1, max_steps=1,
        learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    [row] = await train_rows(model)
    assert row["metrics"]["exceptions"] == 1 and row["metrics"]["groups/trainable"] == 1


async def test_a_group_whose_every_rollout_raised_stops_training(model: art.TrainableModel):
    async def single(model: art.TrainableModel, question: str, config: Any) -> art.Trajectory:
        raise ConnectionError("wrong base URL")

    trainer = PipelineTrainer(
        model, model.backend, make_group_rollout_fn(single, n=2), QUESTIONS, config=None,
        num_rollout_workers=2, min_batch_size=1,
    )  # fmt: skip
    with pytest.raises(art.TooManyExceptionsError, match="All 2 rollouts of a group raised"):
        await trainer.train()
    assert worker_tasks() == []
    assert model.step == 0


# ---------------------------------------------------------------- errors, stop, cancellation


async def test_a_trainer_error_stops_the_workers_and_is_raised(model: art.TrainableModel):
    waiting, cancelled = 0, 0

    async def rollout(model: art.TrainableModel, index: int, config: Any) -> art.TrajectoryGroup:
        nonlocal waiting, cancelled
        if index == 0:  # a message without a role: the training call refuses it
            await wait_until(lambda: waiting == 2)
            bad = art.Trajectory(messages_and_choices=[{"content": "no role"}], reward=1.0)
            return art.TrajectoryGroup([bad, bad.model_copy(update={"reward": 0.0})])
        waiting += 1
        try:
            await asyncio.Event().wait()  # the other workers are mid-rollout
        except asyncio.CancelledError:
            cancelled += 1
            raise
        raise AssertionError("unreachable")

    trainer = PipelineTrainer(
        model, model.backend, rollout, range(10), config=None,
        num_rollout_workers=3, min_batch_size=1, max_batch_size=1,
    )  # fmt: skip
    with pytest.raises(art.InvalidTrajectoryError, match="role"):
        await trainer.train()
    assert cancelled == 2
    assert worker_tasks() == []


async def test_cancelling_train_cancels_the_workers(model: art.TrainableModel):
    started = 0

    async def rollout(model: art.TrainableModel, index: int, config: Any) -> art.TrajectoryGroup:
        nonlocal started
        started += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    trainer = PipelineTrainer(
        model, model.backend, rollout, range(10), config=None, num_rollout_workers=3
    )
    run = asyncio.create_task(trainer.train())
    await wait_until(lambda: started == 3)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert worker_tasks() == []


async def test_request_stop_ends_training_after_the_step(model: art.TrainableModel):
    trainer: PipelineTrainer

    async def stop_at_one(model: art.TrainableModel, step: int, config: Any) -> None:
        trainer.request_stop()  # asked while step 1 is current: no step 2

    trainer = PipelineTrainer(
        model, model.backend, varied_rollout, QUESTIONS, config=None, eval_fn=stop_at_one,
        num_rollout_workers=2, min_batch_size=1, max_batch_size=1, eval_every_n_steps=1,
        eval_at_start=False, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    assert model.step == 1 and await model.get_step() == 1
    assert worker_tasks() == []


# ------------------------------------------------------------------------ settings, retention


def test_unknown_and_unsupported_keywords_are_errors_that_say_what_to_do():
    model = art.TrainableModel(name="m", base_model="tiny")
    with pytest.raises(art.UnknownFieldError, match="did you mean 'max_steps_off_policy'"):
        PipelineTrainer(model, None, varied_rollout, [], None, max_step_off_policy=2)
    with pytest.raises(art.UnknownFieldError, match=r"beta="):
        PipelineTrainer(model, None, varied_rollout, [], None, kl_penalty_coef=0.1)
    with pytest.raises(ValueError, match="not both"):
        PipelineTrainer(
            model, None, varied_rollout, [], None,
            pipeline=PipelineRuntimeConfig(), num_rollout_workers=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="loss"):
        PipelineTrainer(model, None, varied_rollout, [], None, loss_fn="dpo")


def test_defaults_follow_art():
    model = art.TrainableModel(name="m", base_model="tiny")
    trainer = PipelineTrainer(model, None, varied_rollout, [], None)
    assert trainer.max_steps_off_policy == 4
    assert (trainer.num_rollout_workers, trainer.min_batch_size, trainer.max_batch_size) == (
        16,
        4,
        40,
    )
    assert trainer.queue_maxsize == 4 * 40
    assert trainer.eval_every_n_steps == 20 and trainer.eval_at_start
    assert trainer.train_config.learning_rate == 1e-5 and trainer.train_config.loss == "cispo"
    ours = PipelineTrainer(
        model, None, varied_rollout, [], None, loss_fn="ppo",
        train_config=art.TrainConfig(learning_rate=3e-4, max_length=512),
    )  # fmt: skip
    assert ours.train_config.loss == "ppo" and ours.train_config.learning_rate == 3e-4
    assert ours.train_config.max_length == 512
    # ART's attributes read the one settings object the keywords were checked into.
    assert ours.settings.train_config is ours.train_config and ours.settings.min_batch_size == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.settings.max_steps = 3  # type: ignore[misc]
    ours.max_steps = 3  # as in ART: the attribute is assignable, and the settings follow
    assert ours.settings.max_steps == 3 and ours.settings.min_batch_size == 4


def test_keep_recent_and_top_keeps_the_latest_and_the_best():
    def info(step: int, reward: float | None = None) -> CheckpointInfo:
        return CheckpointInfo(step=step, metrics={} if reward is None else {"val/reward": reward})

    context = CheckpointRetentionContext(
        current_step=9,
        checkpoints=[info(0, 0.1), info(2, 0.9), info(4, 0.5), info(5), info(6, 0.2), info(7)],
    )
    assert set(keep_recent_and_top(recent=2, top=2)(context)) == {6, 7, 2, 4}
    assert set(keep_recent_and_top(recent=0, top=1)(context)) == {2}
    assert set(keep_recent_and_top(recent=0, top=0)(context)) == set()
    with pytest.raises(ValueError, match="recent"):
        keep_recent_and_top(recent=-1)


async def test_retention_deletes_old_steps_but_never_the_served_window(model: art.TrainableModel):
    evaluated = iter([0.1, 0.9, 0.2, 0.3, 0.4, 0.5, 0.6])

    async def evaluate(model: art.TrainableModel, step: int, config: Any) -> list[art.Trajectory]:
        return [art.Trajectory(messages_and_choices=[], reward=next(evaluated))]

    offered: list[list[int]] = []
    strategy = keep_recent_and_top(recent=1, top=1)

    def recording(context: CheckpointRetentionContext) -> set[int]:
        offered.append([checkpoint.step for checkpoint in context.checkpoints])
        return set(strategy(context))

    trainer = PipelineTrainer(
        model, model.backend, varied_rollout, QUESTIONS, config=None, eval_fn=evaluate,
        num_rollout_workers=2, min_batch_size=1, max_batch_size=1, max_steps=5,
        max_steps_off_policy=1, eval_every_n_steps=1, learning_rate=1e-3,
        checkpoint_retention_strategy=recording,
    )  # fmt: skip
    await trainer.train()
    assert model.step == 5
    # Steps 5 (current) and 4 (a rollout may still sample it) are never offered.
    assert all(max(steps) < step - 1 for steps, step in zip(offered, range(3, 6), strict=False))
    # Kept: the best by val/reward (step 1: 0.9) and the most recent offered (3), plus the
    # served window (4, 5); the rest went.
    assert await model.backend.checkpoint_steps(model) == [1, 3, 4, 5]
    assert trainer.state.deleted_checkpoints == 2
    served = [m.id for m in (await model.openai_client().models.list()).data]
    assert {f"{model.name}@4", f"{model.name}@5"} <= set(served)


async def test_a_strategy_that_keeps_unknown_steps_is_an_error(model: art.TrainableModel):
    trainer = PipelineTrainer(
        model, model.backend, varied_rollout, QUESTIONS, config=None,
        num_rollout_workers=1, min_batch_size=1, max_batch_size=1, max_steps=3,
        max_steps_off_policy=0, eval_at_start=False, learning_rate=1e-3,
        checkpoint_retention_strategy=lambda context: {99},
    )  # fmt: skip
    with pytest.raises(ValueError, match="not offered"):
        await trainer.train()
    assert 0 in await model.backend.checkpoint_steps(model)  # nothing deleted
