"""Adapter leases (ART main's `art.adapter_leases`, `backend.adapter_lease`): a rollout pinned to
the adapter of the step it began on keeps sampling it while training moves on, and that step's
checkpoint is kept until the lease ends (tiny model, real server on 127.0.0.1).

Where the order matters, a rollout waits on what the trainer has done (its step), never on time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

import art_core as art
from art_core.adapter_leases import (
    AdapterLeaseManager,
    InferenceTarget,
    pin_inference_step,
    pin_inference_target,
    pinned_inference_name,
    pinned_inference_step,
)
from art_core.local import adapter_leases as local_adapter_leases
from art_core.pipeline_trainer import PipelineTrainer
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


async def train_one_step(model: art.TrainableModel) -> art.TrainResult:
    groups = varied_group(await groups_for(model, ["What is 1 + 2?"], per_group=2))
    return await model.train(groups, learning_rate=1e-3)


async def answered_by(model: art.TrainableModel, client: AsyncOpenAI | None = None) -> str:
    """Ask `model.get_inference_name()` once; the name of the adapter the server answered from."""
    response = await (client or model.openai_client()).chat.completions.create(
        model=model.get_inference_name(), messages=QUESTION, max_tokens=2  # type: ignore[arg-type]
    )  # fmt: skip
    return response.model


# ----------------------------------------------------------------------------- the pins alone


async def test_a_pin_names_its_step_and_the_outer_pin_returns_on_exit():
    assert pinned_inference_step("agent") is None
    async with pin_inference_step("agent", 3):
        assert pinned_inference_step("agent") == 3
        assert pinned_inference_name("agent") is None  # a step pin names no served name
        async with pin_inference_target("agent", step=5, inference_name="agent@5"):
            assert pinned_inference_step("agent") == 5
            assert pinned_inference_name("agent") == "agent@5"
            assert pinned_inference_name("agent", step=5) == "agent@5"
            assert pinned_inference_name("agent", step=4) is None  # another step: no pin
            assert pinned_inference_step("other") is None  # pins are per model name
        assert pinned_inference_step("agent") == 3
    assert pinned_inference_step("agent") is None
    with pytest.raises(Exception, match="frozen"):
        InferenceTarget(step=1).step = 2  # type: ignore[misc]


async def test_concurrent_rollouts_each_keep_their_own_pin():
    both_pinned = asyncio.Barrier(2)

    async def rollout(step: int) -> int | None:
        async with pin_inference_step("agent", step):
            await both_pinned.wait()  # the other task has pinned its own step by now
            return pinned_inference_step("agent")

    assert await asyncio.gather(rollout(1), rollout(2)) == [1, 2]
    assert pinned_inference_step("agent") is None


def test_arts_in_flight_lora_name_imports_and_is_refused_on_use():
    from art_core.adapter_leases import in_flight_lora_name

    with pytest.raises(art.UnsupportedOptionError, match="served immutably as <name>@<step>"):
        in_flight_lora_name("agent")


async def test_the_lease_manager_counts_overlapping_leases():
    manager = local_adapter_leases.AdapterLeaseManager()  # ART's path, our one class
    assert manager.__class__ is AdapterLeaseManager
    async with manager.lease(1):
        async with manager.lease(1), manager.lease(2):
            assert manager.active_steps() == {1, 2}
        assert manager.active_steps() == {1}
    assert manager.active_steps() == set()


# ----------------------------------------------------------------------- leases on a backend


async def test_a_rollout_in_a_lease_keeps_sampling_its_step_after_training_moves_on(
    model: art.TrainableModel,
):
    backend = model.backend
    assert isinstance(backend, art.RemoteBackend)
    async with backend.adapter_lease(model, 0), model.rollout() as rollout:
        client = AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.api_key)
        before = await answered_by(model, client)
        await train_one_step(model)  # the plain name and the latest step are now 1
        assert model.step == 1
        after = await answered_by(model, client)
        records = await backend.rollout_records(rollout.id)
    assert (rollout.model, before, after) == (
        f"{model.name}@0",
        f"{model.name}@0",
        f"{model.name}@0",
    )
    # The server's own record of each call names the adapter that answered.
    assert [record["model"] for record in records] == [f"{model.name}@0"] * 2
    # Outside the lease the model samples its newest step again.
    assert model.get_inference_name() == f"{model.name}@1"
    assert await answered_by(model) == f"{model.name}@1"


async def test_exact_adapter_lease_pins_the_served_name_of_its_step(model: art.TrainableModel):
    backend = model.backend
    assert isinstance(backend, art.RemoteBackend)
    await train_one_step(model)
    async with backend.exact_adapter_lease(model, 0):
        assert model.get_inference_name() == f"{model.name}@0"
        assert model.get_inference_name(1) == f"{model.name}@1"  # an explicit step still wins
        assert backend.leased_steps(model) == [0]
    assert backend.leased_steps(model) == []


async def test_a_leased_step_is_kept_by_deletion_and_deleted_after_the_lease(
    model: art.TrainableModel,
):
    backend = model.backend
    assert isinstance(backend, art.RemoteBackend)
    for _ in range(2):
        await train_one_step(model)  # steps 0, 1, 2
    async with backend.adapter_lease(model, 0):
        answer = await backend.delete_checkpoint_steps(model, [0, 1])
        assert (answer["deleted"], answer["held"]) == ([1], [0])
        assert await backend.checkpoint_steps(model) == [0, 2]
        # ART's form (keep the latest and the best) keeps the leased step too.
        answer = await model.delete_checkpoints()
        assert (answer["deleted"], answer["held"]) == ([], [0])
        assert await backend.checkpoint_steps(model) == [0, 2]
    answer = await model.delete_checkpoints()
    assert answer["deleted"] == [0]
    assert await backend.checkpoint_steps(model) == [2]


async def test_the_server_holds_a_leased_step_beyond_the_window_and_against_other_clients(
    model: art.TrainableModel,
):
    """The server keeps 2 steps served (`served_steps`); a lease outlasting 3 training steps
    still samples its step, and another client's deletion (which sends no `keep`) leaves it."""
    backend = model.backend
    assert isinstance(backend, art.RemoteBackend)
    other = art.RemoteBackend(backend.base_url, backend.api_key)
    async with backend.adapter_lease(model, 0):
        for _ in range(3):
            await train_one_step(model)  # steps 1, 2, 3: step 0 is out of the window
        assert await answered_by(model) == f"{model.name}@0"
        answer = await other.delete_checkpoint_steps(model, [0, 1])
        assert (answer["deleted"], answer["held"]) == ([1], [0])
    # Given back: step 0 leaves the engine with the window's next trim (now).
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await model.openai_client().chat.completions.create(
            model=model.get_inference_name(0), messages=QUESTION, max_tokens=2  # type: ignore[arg-type]
        )  # fmt: skip
    await other.close()


async def test_a_lease_on_a_step_without_a_checkpoint_is_refused(model: art.TrainableModel):
    backend = model.backend
    assert isinstance(backend, art.RemoteBackend)
    with pytest.raises(art.UnsupportedOptionError, match=r"no checkpoint for step 7.*\[0\]"):
        async with backend.adapter_lease(model, 7):
            pass
    assert backend.leased_steps(model) == []
    assert model.get_inference_name() == f"{model.name}@0"


# ------------------------------------------------------------------------- the pipeline trainer


async def test_the_pipeline_trainer_pins_each_rollout_to_the_step_it_began_on(
    model: art.TrainableModel,
):
    seen: list[tuple[str, str]] = []

    async def rollout(model: art.TrainableModel, question: str, config: Any) -> art.TrajectoryGroup:
        if not seen:  # the first rollout straddles step 1: it asks again once step 1 is trained
            seen.append(("", ""))
            before = await answered_by(model)
            while model.step < 1:
                await asyncio.sleep(0.01)
            seen[0] = (before, await answered_by(model))
        group = varied_group(await groups_for(model, [question], per_group=2))[0]
        return group

    trainer = PipelineTrainer(
        model, model.backend, rollout, [f"What is {i} + 1?" for i in range(8)], config=None,
        num_rollout_workers=2, min_batch_size=1, max_batch_size=1, max_steps=2,
        max_steps_off_policy=1, eval_at_start=False, learning_rate=1e-3,
    )  # fmt: skip
    await trainer.train()
    assert model.step == 2
    assert seen[0] == (f"{model.name}@0", f"{model.name}@0")
