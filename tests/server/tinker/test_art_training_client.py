"""ART main's `art.training` (`art_core.training`): Tinker's primitive for a registered model.

A model registered through an ordinary RemoteBackend samples a group on a real art-server; its
training client adds the group's gradient, steps, and publishes the step, which the server then
serves as `<name>@1`. Commands are admitted in order (a retry answered once, a gap or a reused
id refused); an input object trains the exact rows it stored, and refuses bytes changed since.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

pytest.importorskip("tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'")

import art_core as art
from art_core.errors import TrainingCommandError, TrainingInputMismatchError
from art_core.training import (
    AdamConfig,
    ForwardBackwardRequest,
    ForwardRequest,
    LossConfig,
    OperationRef,
    OptimStepRequest,
    RlTrajectoryBatch,
    RunCommandLedger,
    SamplerPublication,
    SaveWeightsForSamplerRequest,
    SupervisedTrajectoryBatch,
    TrainingClient,
)
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer, running_tinker_server

API_KEY = "tml-training-client"


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_tinker_server(
        tiny_model_dir, tmp_path_factory.mktemp("art-training"), api_key=API_KEY
    ) as running:
        yield running


async def registered(server: RunningServer, name: str) -> art.TrainableModel:
    model = art.TrainableModel(name=name, project="training-client", base_model="tiny")
    await model.register(art.RemoteBackend(server.url, API_KEY))
    return model


def command(client: TrainingClient, sequence_id: int, request_id: str | None = None) -> dict:
    return {
        "run_id": client.run_id,
        "request_id": request_id or f"r{sequence_id}",
        "sequence_id": sequence_id,
    }


# ---------------------------------------------------------------------------- the whole loop


async def test_a_step_through_the_training_client_is_served_as_the_models_next_step(
    server: RunningServer, tmp_path: Path
):
    model = await registered(server, "loop")
    groups = varied_group(await groups_for(model, ["Name a colour."], per_group=3))
    client = await TrainingClient.create(model, input_dir=tmp_path)
    batch = RlTrajectoryBatch(groups=groups)
    # Sent back to back without waiting: they reach the server in their order.
    fb = await client.forward_backward(
        ForwardBackwardRequest(**command(client, 0), batch=batch, loss=LossConfig(name="cispo"))
    )
    step = await client.optim_step(
        OptimStepRequest(**command(client, 1), optimizer=AdamConfig(learning_rate=1e-3))
    )
    save = await client.save_weights_for_sampler(
        SaveWeightsForSamplerRequest(
            **command(client, 2),
            checkpoint_name="first",
            publication=SamplerPublication(mode="versioned_lora", model_alias=model.name),
        )
    )
    assert client.projected_learner_version == 1
    assert (fb.ref.learner_parent_version, fb.ref.reserved_output_learner_version) == (0, None)
    assert (step.ref.learner_parent_version, step.ref.reserved_output_learner_version) == (0, 1)
    backward = await fb.result()
    assert len(backward.loss_fn_outputs) == 3  # one row per recorded turn
    assert all(o.token_logprobs for o in backward.loss_fn_outputs)
    packing = backward.packing
    assert packing.packed_sequences == 3 and packing.trainable_assistant_tokens > 0
    # Every row was sampled from step 0 (`loop@0`), as the server's records say.
    assert [c.policy_version for c in packing.policy_token_counts or ()] == [0]
    stepped = await step.result()
    assert stepped.contributing_forward_backward_operation_ids == (fb.ref.operation_id,)
    assert stepped.checkpoint.learner_version == 1 and "grad_norm" in stepped.metrics
    saved = await save.result()
    assert saved.served_model == "loop@1" and await model.get_step() == 1
    reply = await model.openai_client().chat.completions.create(
        model="loop@1", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.choices[0].message.content is not None
    await client.close()
    await model.backend.close()


async def test_forward_scores_a_supervised_batch_without_a_gradient(
    server: RunningServer, tmp_path: Path
):
    model = await registered(server, "sft")
    [group] = await groups_for(model, ["Say hi."], per_group=2)
    client = await TrainingClient.create(model, input_dir=tmp_path)
    batch = SupervisedTrajectoryBatch(trajectories=group.trajectories, assistant_turns="last")
    scored = await client.forward(
        ForwardRequest(**command(client, 0), batch=batch, loss=LossConfig(name="cross_entropy"))
    )
    result = await scored.result()
    assert len(result.loss_fn_outputs) == 2
    assert all(value <= 0 for o in result.loss_fn_outputs for value in o.token_logprobs)
    with pytest.raises(TrainingCommandError, match="no forward_backward"):
        await client.optim_step(
            OptimStepRequest(**command(client, 1), optimizer=AdamConfig(learning_rate=1e-3))
        )
    await client.close()
    await model.backend.close()


async def test_an_input_object_trains_its_stored_rows_and_refuses_changed_bytes(
    server: RunningServer, tmp_path: Path
):
    model = await registered(server, "objects")
    groups = varied_group(await groups_for(model, ["Count to two."], per_group=2))
    client = await TrainingClient.create(model, input_dir=tmp_path)
    ref = await client.put_input(RlTrajectoryBatch(groups=groups))
    assert ref == await client.put_input(RlTrajectoryBatch(groups=groups))  # same rows, same object
    loss = LossConfig(name="importance_sampling")
    first = await client.forward(ForwardRequest(**command(client, 0), batch=ref, loss=loss))
    assert len((await first.result()).loss_fn_outputs) == 2
    stored = Path(ref.object.locator)
    stored.chmod(0o644)
    stored.write_bytes(stored.read_bytes().replace(b'"advantages":[', b'"advantages":[9,'))
    changed = await client.forward(ForwardRequest(**command(client, 1), batch=ref, loss=loss))
    with pytest.raises(TrainingInputMismatchError, match="changed after it was stored"):
        await changed.result()
    await client.close()
    await model.backend.close()


# ---------------------------------------------------------------------------- in order, once


def test_commands_are_admitted_in_order_and_a_retry_once():
    ledger = RunCommandLedger("p/m")
    adam = AdamConfig(learning_rate=1e-5)
    first = ledger.admit(
        OptimStepRequest(run_id="p/m", request_id="a", sequence_id=0, optimizer=adam), "optim_step"
    )
    again = ledger.admit(
        OptimStepRequest(run_id="p/m", request_id="a", sequence_id=0, optimizer=adam), "optim_step"
    )
    assert first.status == "admitted" and again.status == "replayed" and again.ref == first.ref
    assert ledger.learner_version == 1 and ledger.next_sequence_id == 1
    with pytest.raises(TrainingCommandError, match="next is 1"):
        ledger.admit(
            OptimStepRequest(run_id="p/m", request_id="b", sequence_id=3, optimizer=adam),
            "optim_step",
        )
    with pytest.raises(TrainingCommandError, match="used for another command"):
        other = AdamConfig(learning_rate=2e-5)
        ledger.admit(
            OptimStepRequest(run_id="p/m", request_id="a", sequence_id=0, optimizer=other),
            "optim_step",
        )
    with pytest.raises(TrainingCommandError, match="this client trains 'p/m'"):
        ledger.admit(
            OptimStepRequest(run_id="q/m", request_id="c", sequence_id=1, optimizer=adam),
            "optim_step",
        )
    assert ledger.next_sequence_id == 1  # nothing refused was admitted


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: AdamConfig(learning_rate=float("inf")), "finite"),
        (lambda: AdamConfig(learning_rate=1e-5, beta2=1.0), "less than 1"),
        (lambda: SamplerPublication(mode="in_flight_lora", model_alias="m"), "<name>@<step>"),
        (lambda: SamplerPublication(mode="versioned_lora"), "model_alias is required"),
        (
            lambda: OperationRef(
                run_id="p/m",
                operation_id="o",
                sequence_id=0,
                learner_parent_version=2,
                reserved_output_learner_version=4,
                kind="optim_step",
            ),
            "exactly one version",
        ),
        (
            lambda: ForwardRequest(
                run_id="p/m",
                request_id="r",
                sequence_id=0,
                batch=SupervisedTrajectoryBatch(
                    trajectories=[art.Trajectory(messages_and_choices=[])]
                ),
                loss=LossConfig(name="cispo"),
            ),
            "sft batches take the loss cross_entropy",
        ),
        (lambda: RlTrajectoryBatch(groups=[art.TrajectoryGroup([])]), "nothing to compare"),
        (lambda: LossConfig(name="cispo", normalise=True), "Extra inputs"),
    ],
)
def test_a_malformed_contract_is_refused_when_built(build, says: str):
    with pytest.raises(ValidationError, match=says):
        build()
