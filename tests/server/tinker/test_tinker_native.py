"""ART's Tinker backends (`art_core.tinker_native`, `art_core.tinker`) against a real art-server.

ART code registers a model, samples through the server and trains a step through the `tinker`
SDK: the step's datums are the recorded turns' exact tokens and logprobs with ART's group
advantages, the server then serves `<name>@1`, and the step is in the model's history like any.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'")

import art_core as art
from art_core.errors import UnsupportedOptionError
from art_core.tinker import TinkerBackend
from art_core.tinker_native import (
    TinkerNativeBackend,
    group_advantages,
    turn_datum,
)
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer, running_tinker_server

API_KEY = "tml-native-key"


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_tinker_server(
        tiny_model_dir, tmp_path_factory.mktemp("art-native"), api_key=API_KEY
    ) as running:
        yield running


def test_a_turn_becomes_a_datum_with_zeros_on_the_prompt():
    parts = turn_datum([1, 2, 3], [7, 8], [-0.5, -1.5], 2.0)
    assert parts == {
        "input": [1, 2, 3, 7],
        "target_tokens": [2, 3, 7, 8],
        "logprobs": [0.0, 0.0, -0.5, -1.5],
        "advantages": [0.0, 0.0, 2.0, 2.0],
    }
    with pytest.raises(ValueError, match="one logprob per token"):
        turn_datum([1], [7, 8], [-0.5], 1.0)


def test_group_advantages_follow_art():
    assert group_advantages([1.0, 1.0, 1.0], True) is None
    assert group_advantages([0.0, 2.0], True) == [-1.0, 1.0]
    assert group_advantages([0.0, 2.0], False) == [-1.0, 1.0 * 1.0]
    assert group_advantages([0.0, 4.0], False) == [-2.0, 2.0]


async def test_art_code_trains_a_step_through_the_tinker_api(server: RunningServer):
    backend = TinkerNativeBackend(base_url=server.url, tinker_api_key=API_KEY)
    model = art.TrainableModel(name="native", project="ported", base_model="tiny")
    await model.register(backend)
    groups = varied_group(await groups_for(model, ["What is 1 + 1?", "Name a colour."]))
    before = await backend.history(model)
    result = await backend.train(model, groups, learning_rate=1e-3)
    assert result.step == 1 and await model.get_step() == 1
    assert result.metrics["data/step_num_datums"] == 8
    assert result.metrics["data/step_num_groups_trainable"] == 2
    assert "grad_norm" in result.metrics
    history = await backend.history(model)
    assert len(history) > len(before)
    # The new step serves, by ART's inference name, on the same server.
    reply = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
    )
    assert reply.model.endswith("@1")
    # The run is the Tinker API's too: its sampler weights are listed by the SDK.
    training = backend.training_client(model)
    listed = [c.checkpoint_id for c in (await _checkpoints(server, training.model_id))]
    assert listed == ["sampler_weights/step_000001"]
    # A group with equal rewards teaches nothing: no step, counted.
    flat = await groups_for(model, ["Name a colour."])
    for trajectory in flat[0]:
        trajectory.reward = 1.0
    nothing = await backend.train(model, flat)
    assert nothing.step == 1 and nothing.metrics["data/step_num_groups_trainable"] == 0
    await backend.close()


async def _checkpoints(server: RunningServer, model_id: str):
    import tinker

    rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
    return (await rest.list_checkpoints(model_id)).checkpoints


async def test_unserved_keywords_are_refused_by_name(server: RunningServer):
    backend = TinkerBackend(base_url=server.url, tinker_api_key=API_KEY, in_process=True)
    model = art.TrainableModel(name="native-refusals", project="ported", base_model="tiny")
    await model.register(backend)
    with pytest.raises(UnsupportedOptionError, match="kl_penalty_coef"):
        await backend.train(model, [], kl_penalty_coef=0.1)
    with pytest.raises(UnsupportedOptionError, match="loss_fn 'dro'"):
        await backend.train(model, [], loss_fn="dro")
    with pytest.raises(UnsupportedOptionError, match="epsilon"):
        await backend.train(model, [], epsilon=0.2)
    await backend.close()


def test_the_sdk_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    import sys

    monkeypatch.setitem(sys.modules, "tinker", None)
    from art_core import tinker_native

    with pytest.raises(ImportError, match=r"art\[tinker\]"):
        tinker_native._tinker()
