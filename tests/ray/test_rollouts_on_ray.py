"""Rollouts on a loopback Ray cluster (a head and two worker nodes) against the real server:
their trajectories come back with their exact tokens and train; failures are counted."""

from __future__ import annotations

from typing import Any

import pytest

import art_core as art
from art_core.errors import TooManyExceptionsError
from art_core.pipeline_trainer import PipelineTrainer
from art_ray import RayExecutor
from tests.ray._rollouts import failing_rollout, group_rollout, slow_rollout, two_turn_rollout
from tests.support.models import fresh_model

QUESTIONS = ["Count to three.", "Name a colour.", "Say hello.", "Pick a number."]


@pytest.fixture(scope="module")
def executor(cluster: Any):
    """Two workers, one per worker node (each node has one `art_rollout`)."""
    with RayExecutor(workers=2, resources={"art_rollout": 1}, timeout=120) as running:
        yield running


async def test_rollouts_on_two_nodes_come_back_exact_and_train(
    executor: RayExecutor, remote_backend: art.RemoteBackend, tiny_model_dir
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    workers = await executor.where()
    assert len({w["node_id"] for w in workers}) == 2  # spread: one worker per node

    for step in range(2):
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(executor.run(two_turn_rollout, model, q) for _ in range(4))
                for q in QUESTIONS
            ),
            pbar_desc=None,
        )
        trajectories = [t for g in groups for t in g.trajectories]
        assert len(trajectories) == 16 and not any(g.exceptions for g in groups)
        # Both nodes ran rollouts, and each capture scope assembled its run on the worker.
        assert {t.metadata["node_id"] for t in trajectories} == {w["node_id"] for w in workers}
        for trajectory in trajectories:
            assert [m["role"] for m in trajectory.messages()] == [
                "user", "assistant", "user", "assistant",
            ]  # fmt: skip
        for group in groups:  # distinct rewards: every group trains
            for index, trajectory in enumerate(group.trajectories):
                trajectory.reward = float(index)
        result = await model.train(groups, learning_rate=1e-3)
        # Sampled on other nodes, trained here: the server found every completion by id and
        # its tokens' logprobs match the sampler's.
        assert result.metrics["trajectories"] == 16 and result.metrics["groups/trainable"] == 4
        assert abs(result.metrics["ratio_mean"] - 1.0) < 1e-3
        assert model.step == step + 1
    assert sum(executor.stats.nodes.values()) == executor.stats.completed >= 32
    assert executor.stats.retried == 0 and executor.stats.lost == 0


async def test_a_rollouts_exception_arrives_as_itself_and_is_counted(
    executor: RayExecutor, remote_backend: art.RemoteBackend, tiny_model_dir
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    groups = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup(
                [
                    executor.run(two_turn_rollout, model, "Hi."),
                    executor.run(failing_rollout, model, "q"),
                ]
            )
        ],
        pbar_desc=None,
        max_exceptions=1,
    )
    [failed] = groups[0].exceptions
    # The user's type and message, not Ray's wrapper; the remote traceback kept for reading.
    assert (failed.type, failed.message) == ("ValueError", "'q' fails on purpose")
    assert "raised on a Ray worker" in failed.traceback
    assert len(groups[0].trajectories) == 1

    with pytest.raises(TooManyExceptionsError) as raised:
        await art.gather_trajectory_groups(
            [art.TrajectoryGroup(executor.run(failing_rollout, model, "q") for _ in range(2))],
            pbar_desc=None,
            max_exceptions=0,
        )
    assert isinstance(raised.value.__cause__, ValueError)


async def test_the_pipeline_trainer_runs_its_rollouts_on_the_cluster(
    executor: RayExecutor, remote_backend: art.RemoteBackend, tiny_model_dir
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    before = executor.stats.completed
    trainer = PipelineTrainer(
        model, model.backend, group_rollout, QUESTIONS[:2], config=None, executor=executor,
        num_rollout_workers=2, min_batch_size=1, max_batch_size=1, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    assert executor.stats.completed == before + 2  # one call per group, run on a worker
    assert trainer.state.total_scenarios_consumed == 2
    # Each group came back with its three runs and its failed one kept (counted, not trained).
    rows = [row for row in await model.backend.history(model) if row["type"] == "train"]
    assert model.step == len(rows) == 2
    assert [row["metrics"]["exceptions"] for row in rows] == [1, 1]
    assert [row["metrics"]["trajectories"] for row in rows] == [3, 3]


async def test_bad_settings_are_refused_before_anything_starts(cluster: Any):
    for settings, message in [
        ({"workers": 0}, "workers must be >= 1"),
        ({"infra_retries": -1}, "infra_retries must be >= 0"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"resources": {"art_gpu_node": 1}}, "no node in the Ray cluster has the resource"),
        # A loopback cluster is art_ray.testing's: its own argument, not `ray start`.
        ({"resources": {"art_gpu_node": 1}}, r"local_cluster\(\.\.\., node_resources="),
        ({"heartbeat": 0}, "heartbeat must be > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            RayExecutor(**settings)
    with (
        RayExecutor(workers=1) as executor,
        pytest.raises(TypeError, match="needs a rollout function"),
    ):
        executor.run("not a function")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="shut down"):
        executor.run(failing_rollout, None, "q")


async def test_a_rollout_past_its_deadline_is_cancelled_and_counted(cluster: Any, tmp_path):
    with RayExecutor(workers=1, timeout=1.0) as executor:
        [group] = await art.gather_trajectory_groups(
            [
                art.TrajectoryGroup(
                    [
                        executor.run(slow_rollout, str(tmp_path), 0, 600.0),  # never ends in time
                        executor.run(slow_rollout, str(tmp_path), 1, 0.0),
                    ]
                )
            ],
            pbar_desc=None,
            max_exceptions=1,
        )
        [late] = group.exceptions
        assert late.type == "RolloutTimeoutError" and "timeout=1.0" in late.message
        assert [t.reward for t in group.trajectories] == [1.0]
        assert executor.stats.timed_out == executor.stats.failed == 1
        # Its worker was replaced (the cancelled rollout might hold a thread); the new one takes
        # the next rollout.
        assert executor.stats.workers_replaced == 1 and executor.workers == 1
        assert (await executor.run(slow_rollout, str(tmp_path), 2, 0.0)).reward == 2.0
