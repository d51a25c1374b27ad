"""A misspelt field, keyword or attribute is an error that names it, never silently ignored.

Every case raises `art.UnknownFieldError` (a TypeError, as Python raises for an unexpected
keyword) naming the unknown name, the closest known one and all known ones; the correct spelling
of the same call works.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import art_core as art
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group

UNREGISTERED = art.TrainableModel(name="unknown-fields", base_model="tiny")
EMPTY_GROUP = art.TrajectoryGroup([])


def _assign(target: Any, name: str, value: Any) -> Callable[[], None]:
    return lambda: setattr(target, name, value)


# (the call with a typo, the unknown name, the name the error suggests, the call spelt right)
SYNC_CASES: list[tuple[Callable[[], Any], str, str | None, Callable[[], Any]]] = [
    # Every public constructor, as pydantic models do.
    (
        lambda: art.TrainableModel(nmae="a", base_model="tiny"),  # type: ignore[call-arg]
        "nmae",
        "name",
        lambda: art.TrainableModel(name="a", base_model="tiny"),
    ),
    (
        lambda: art.Model(name="judge", base_ur="http://127.0.0.1:1/v1"),
        "base_ur",
        "base_url",
        lambda: art.Model(name="judge", base_url="http://127.0.0.1:1/v1"),
    ),
    (
        lambda: art.LocalBackend(pth="/tmp/unused"),
        "pth",
        "path",
        lambda: art.LocalBackend(path="/tmp/unused"),
    ),
    (
        lambda: art.RemoteBackend("http://127.0.0.1:1", api_ky="k"),
        "api_ky",
        "api_key",
        lambda: art.RemoteBackend("http://127.0.0.1:1", api_key="k"),
    ),
    (lambda: art.Trajectory(rewrd=5), "rewrd", "reward", lambda: art.Trajectory(reward=5)),  # type: ignore[call-arg]
    (
        lambda: art.Trajectory(mesages_and_choices=[{"role": "user", "content": "hi"}]),  # type: ignore[call-arg]
        "mesages_and_choices",
        "messages_and_choices",
        lambda: art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}]),
    ),
    (
        _assign(art.Trajectory(), "rewad", 1.0),
        "rewad",
        "reward",
        _assign(art.Trajectory(), "reward", 1.0),
    ),
    (
        lambda: art.TrainConfig(learning_rat=5e-2),  # type: ignore[call-arg]
        "learning_rat",
        "learning_rate",
        lambda: art.TrainConfig(learning_rate=5e-2),
    ),
    (lambda: art.TrainConfig(lr=5e-2), "lr", "learning_rate", lambda: art.TrainConfig()),  # type: ignore[call-arg]
    (
        _assign(art.TrainConfig(), "max_grad_nrom", 0.5),
        "max_grad_nrom",
        "max_grad_norm",
        _assign(art.TrainConfig(), "max_grad_norm", 0.5),
    ),
    (
        lambda: art.TrainSFTConfig(epoch=2),  # type: ignore[call-arg]
        "epoch",
        "epochs",
        lambda: art.TrainSFTConfig(epochs=2),
    ),
    (lambda: art.LoRAConfig(rank=8), "rank", "r", lambda: art.LoRAConfig(r=8)),  # type: ignore[call-arg]
    (
        lambda: art.LoRAConfig(lora_alpha=8),  # type: ignore[call-arg]
        "lora_alpha",
        "alpha",
        lambda: art.LoRAConfig(alpha=8),
    ),
    (
        lambda: art.TrainableModel(name="m", base_model="tiny", lora={"lora_dropout": 0.1}),
        "lora_dropout",
        "dropout",
        lambda: art.TrainableModel(name="m", base_model="tiny", lora={"dropout": 0.1}),
    ),
    (
        lambda: art.Model(name="judge", price={"input_per_million": 1, "output": 2}),
        "output",
        "output_per_million",
        lambda: art.Model(name="judge", price={"input_per_million": 1, "output_per_million": 2}),
    ),
    (
        lambda: art.RolloutException(type="E", message="m", traceback="", trace=""),  # type: ignore[call-arg]
        "trace",
        "traceback",
        lambda: art.RolloutException(type="E", message="m", traceback=""),
    ),
]

ASYNC_CASES: list[tuple[Callable[[], Awaitable[Any]], str, str | None]] = [
    # Checked before the model is even looked at: an unregistered model still names the typo.
    (lambda: UNREGISTERED.train([], learning_rat=5e-2), "learning_rat", "learning_rate"),
    (lambda: UNREGISTERED.train_sft([], batchsize=4), "batchsize", "batch_size"),
    (
        lambda: art.ruler_score_group(EMPTY_GROUP, "openai/gpt-4.1-mini", swallow_exception=True),
        "swallow_exception",
        "swallow_exceptions",
    ),
    (
        lambda: art.autorl(
            "add numbers",
            UNREGISTERED,
            judge="openai/gpt-4.1-mini",
            judge_options={"reverse_order": True},
        ),
        "reverse_order",
        "reverse_order_check",
    ),
]


def _check(error: art.UnknownFieldError, unknown: str, suggestion: str | None) -> None:
    message = str(error)
    assert repr(unknown) in message and error.unknown == [unknown]
    assert isinstance(error, TypeError) and isinstance(error, art.ArtError)
    if suggestion is not None:
        assert f"did you mean {suggestion!r}" in message
        assert suggestion in error.known and suggestion in message.split("Known")[1]


@pytest.mark.parametrize(("call", "unknown", "suggestion", "correct"), SYNC_CASES)
def test_an_unknown_field_is_named_and_the_right_spelling_works(
    call: Callable[[], Any],
    unknown: str,
    suggestion: str | None,
    correct: Callable[[], Any],
):
    with pytest.raises(art.UnknownFieldError) as raised:
        call()
    _check(raised.value, unknown, suggestion)
    correct()


@pytest.mark.parametrize(("call", "unknown", "suggestion"), ASYNC_CASES)
async def test_an_unknown_keyword_is_named_before_any_work(
    call: Callable[[], Awaitable[Any]], unknown: str, suggestion: str | None
):
    with pytest.raises(art.UnknownFieldError) as raised:
        await call()
    _check(raised.value, unknown, suggestion)


def test_messages_is_arts_old_name_for_messages_and_choices():
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.warns(DeprecationWarning, match="messages_and_choices"):
        trajectory = art.Trajectory(messages=conversation, reward=1.0)  # type: ignore[call-arg]
    assert trajectory.messages_and_choices == conversation and trajectory.reward == 1.0
    with pytest.warns(DeprecationWarning):
        history = art.History(messages=conversation[:1])  # type: ignore[call-arg]
    assert history.messages() == conversation[:1]
    with pytest.raises(art.UnknownFieldError, match=r"one field.*messages_and_choices=\[\.\.\.\]"):
        art.Trajectory(messages=conversation, messages_and_choices=conversation)  # type: ignore[call-arg]


async def test_arts_dev_config_keyword_maps_and_refuses_an_unknown_key_by_name():
    with pytest.raises(art.UnsupportedOptionError, match=r"TrainConfig.plot_tensors.*not honoured"):
        await UNREGISTERED.train([], _config={"plot_tensors": True})
    with pytest.raises(art.UnsupportedOptionError, match="moe_routing_replay_path"):
        await UNREGISTERED.train([], _config={"moe_routing_replay_path": "/x"})
    with pytest.raises(art.ModelNotRegisteredError):  # mapped: the call goes on to the backend
        await UNREGISTERED.train([], _config=art.dev.TrainConfig(epsilon=0.2, ppo=True))


def test_arts_internal_config_is_honoured_where_we_can_and_refused_with_a_note_elsewhere():
    model = art.TrainableModel(
        name="a",
        base_model="tiny",
        _internal_config=art.dev.InternalModelConfig(
            lora_config=art.dev.LoRAConfig(rank=8),
            engine_args=art.dev.EngineArgs(dtype="float32", max_num_seqs=4),
        ),
    )
    assert model.lora_config.r == 8
    assert model.engine_settings == {"dtype": "float32", "max_batch_size": 4}
    with pytest.warns(art.dev.IgnoredSettingWarning, match=r"gpu_memory_utilization.*ignored"):
        art.TrainableModel(
            name="a",
            base_model="tiny",
            _internal_config={"init_args": {"gpu_memory_utilization": 0.8}},
        )
    with pytest.raises(art.UnsupportedOptionError, match=r"load_in_4bit.*LocalBackend"):
        art.TrainableModel(
            name="a",
            base_model="tiny",
            _internal_config={"init_args": {"load_in_4bit": True}},
        )
    with pytest.raises(art.UnknownFieldError, match="Only a TrainableModel"):
        art.Model(name="judge", _internal_config={})


def test_arts_backend_keywords_we_do_not_have_say_why():
    with pytest.raises(art.UnknownFieldError, match="token prices"):
        art.LocalBackend(gpu_cost_per_hour_usd=3.0)


def test_validation_from_data_keeps_pydantics_error_with_the_fields_location():
    # The server validates its request bodies with these models and answers this error as a
    # 400 whose `param` is the location: it must stay a ValidationError, nested ones included.
    with pytest.raises(ValidationError) as raised:
        art.Trajectory.model_validate({"additional_histories": [{"messages": []}]})
    [error] = raised.value.errors()
    assert error["type"] == "extra_forbidden"
    assert error["loc"] == ("additional_histories", 0, "messages")
    with pytest.raises(ValidationError, match="learning_rat"):
        art.TrainConfig.model_validate({"learning_rat": 5e-2})


def test_open_dicts_stay_open():
    trajectory = art.Trajectory(
        metadata={"any key": 1, "nested": {"x": [1]}}, metrics={"custom/metric": 2.0}
    )
    trajectory.metadata["later"] = "added"
    group = art.TrajectoryGroup([trajectory], metadata={"free": "form"}, metrics={"judge/x": 1})
    assert group.trajectories[0].metadata["later"] == "added"


def test_server_results_keep_unknown_fields_out_of_the_way():
    # A newer server may send more: what this client reads back is not refused.
    result = art.TrainResult.model_validate({"step": 3, "metrics": {}, "added_later": True})
    assert result.step == 3


def test_a_wrong_value_still_names_its_field():
    with pytest.raises(ValidationError, match="learning_rate"):
        art.TrainConfig(learning_rate=-1)
    config = art.TrainConfig()
    with pytest.raises(ValidationError, match="learning_rate"):
        config.learning_rate = 5.0  # assignment is validated too


async def test_misspelt_train_keyword_trains_nothing_and_the_right_one_sets_the_rate(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    groups = varied_group(await groups_for(model, ["What is 1 + 1?"]))
    with pytest.raises(art.UnknownFieldError, match="learning_rat"):
        await model.train(groups, learning_rat=5e-2)
    assert await model.get_step() == 0
    # A keyword overrides the config it is given; the server reports the rate it used.
    result = await model.train(
        groups, config=art.TrainConfig(learning_rate=1e-4, max_grad_norm=0.5), learning_rate=5e-2
    )
    assert result.step == 1 and result.metrics["learning_rate"] == pytest.approx(5e-2)
    result = await model.train(groups, config={"learning_rate": 2e-4})
    assert result.metrics["learning_rate"] == pytest.approx(2e-4)


async def test_a_misspelt_capture_attribute_is_an_error(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    with pytest.raises(art.UnknownFieldError, match="did you mean 'reward'"):
        async with model.rollout() as capture:
            capture.rewad = 1.0  # type: ignore[attr-defined]
    async with model.rollout() as capture:
        capture.reward = 1.0
    assert capture.trajectory.reward == 1.0
