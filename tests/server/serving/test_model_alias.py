"""A trained model's plain name is an alias of its latest served step (ART's `model=model.name`).

`agent` answers from the newest `agent@N`; `agent@N` still pins a step; the response and the
server's record name the step that answered, so training sees exact steps.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

import art_core as art
from tests.support.adapters import make_random_adapter
from tests.support.models import fresh_model
from tests.support.servers import RunningServer

QUESTION = [{"role": "user", "content": "What is 1 + 1?"}]


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


async def greedy_logprobs(model: art.TrainableModel, name: str) -> tuple[str, list[float]]:
    """(the response's `model`, the sampled logprobs) of a greedy answer from `name`."""
    response = await model.openai_client().chat.completions.create(
        model=name, messages=QUESTION, max_tokens=6, temperature=0.0, logprobs=True  # type: ignore[arg-type]
    )  # fmt: skip
    content = response.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    return response.model, [entry.logprob for entry in content]


def recorded_model(server: RunningServer, completion_id: str) -> str:
    record = httpx.get(f"{server.url}/v1/chat/completions/{completion_id}").json()
    return record["model"]


async def alias_rollout(model: art.TrainableModel, reward: float) -> art.Trajectory:
    """A tutorial-style rollout: `model=model.name`, the choice kept as the trainable turn."""
    response = await model.openai_client().chat.completions.create(
        model=model.name, messages=QUESTION, max_tokens=6  # type: ignore[arg-type]
    )  # fmt: skip
    return art.Trajectory(messages_and_choices=[*QUESTION, response.choices[0]], reward=reward)


async def test_plain_name_answers_from_step_0_then_step_1(
    model: art.TrainableModel, training_server: RunningServer
):
    client = model.openai_client()
    before = await client.chat.completions.create(
        model=model.name, messages=QUESTION, max_tokens=4  # type: ignore[arg-type]
    )  # fmt: skip
    assert before.model == f"{model.name}@0"
    assert recorded_model(training_server, before.id) == f"{model.name}@0"
    step_0 = await greedy_logprobs(model, f"{model.name}@0")

    # Completions made through the alias train like any other (their records are exact).
    groups = [art.TrajectoryGroup([await alias_rollout(model, float(r)) for r in range(4)])]
    await model.train(groups, config=art.TrainConfig(learning_rate=5e-3))
    assert model.get_inference_name() == f"{model.name}@1"

    after = await client.chat.completions.create(
        model=model.name, messages=QUESTION, max_tokens=4  # type: ignore[arg-type]
    )  # fmt: skip
    assert after.model == f"{model.name}@1"
    assert recorded_model(training_server, after.id) == f"{model.name}@1"
    # Not just the label: the alias computes with step 1's weights, and a pin still holds.
    via_alias = await greedy_logprobs(model, model.name)
    pinned = await greedy_logprobs(model, f"{model.name}@1")
    assert via_alias[0] == pinned[0] and via_alias[1] == pytest.approx(pinned[1], abs=1e-4)
    still_0 = await greedy_logprobs(model, f"{model.name}@0")
    assert still_0[0] == step_0[0] and still_0[1] == pytest.approx(step_0[1], abs=1e-4)
    assert via_alias[1] != pytest.approx(step_0[1], abs=1e-4)


async def test_streamed_chunks_and_record_name_the_answering_step(
    model: art.TrainableModel, training_server: RunningServer
):
    stream = await model.openai_client().chat.completions.create(
        model=model.name, messages=QUESTION, max_tokens=4, stream=True  # type: ignore[arg-type]
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert {chunk.model for chunk in chunks} == {f"{model.name}@0"}
    assert recorded_model(training_server, chunks[0].id) == f"{model.name}@0"


async def test_models_list_shows_the_plain_name_before_its_steps(model: art.TrainableModel):
    served = [entry.id for entry in (await model.openai_client().models.list()).data]
    position = served.index(model.name)
    assert served[position + 1] == f"{model.name}@0"
    assert served[0] != model.name  # the base model stays first


@pytest.mark.parametrize("suffix", ["-unknown", "@7", "@"])
async def test_unknown_names_are_a_404_listing_the_served_models(
    model: art.TrainableModel, suffix: str
):
    with pytest.raises(openai.NotFoundError, match="Served models: ") as caught:
        await model.openai_client().chat.completions.create(
            model=model.name + suffix, messages=QUESTION, max_tokens=4  # type: ignore[arg-type]
        )  # fmt: skip
    assert f"{model.name}, {model.name}@0" in str(caught.value)


def test_steps_are_listed_in_numeric_order_and_the_alias_takes_the_highest(
    server: RunningServer, tiny_model_dir: Path, client: openai.OpenAI
):
    checkpoints = server.art_path / "alias" / "models" / "order" / "checkpoints"
    for step in (9, 10):
        folder = make_random_adapter(tiny_model_dir, checkpoints / f"{step:04d}", seed=step)
        loaded = httpx.post(
            f"{server.url}/v1/adapters", json={"name": f"order@{step}", "path": str(folder)}
        )
        assert loaded.status_code == 200, loaded.text
    served = [entry.id for entry in client.models.list() if entry.id.startswith("order")]
    assert served == ["order", "order@9", "order@10"]

    def greedy(name: str) -> tuple[str, list[int]]:
        reply = client.chat.completions.create(
            model=name, messages=QUESTION, max_tokens=6, temperature=0  # type: ignore[arg-type]
        )  # fmt: skip
        return reply.model, reply.choices[0].model_extra["token_ids"]  # type: ignore[index]

    assert greedy("order") == greedy("order@10")
