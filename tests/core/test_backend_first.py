"""ART 0.5.23's backend-first training API, end to end, on RemoteBackend and LocalBackend alike.

`result = await backend.train(model, groups, learning_rate=...)`, then
`await model.log(groups, metrics=result.metrics, step=result.step, split="train")`.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import art_core as art
from tests.support.rollouts import groups_for, varied_group

QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]


async def trained_groups(model: art.TrainableModel) -> list[art.TrajectoryGroup]:
    """Rollouts through `model.openai_client()`, with rewards 0..3 in each group."""
    return varied_group(await groups_for(model, QUESTIONS))


async def test_backend_train_with_art_keywords_returns_a_train_result(
    backend: art.RemoteBackend, model: art.TrainableModel
):
    groups = await trained_groups(model)
    result = await backend.train(model, groups, learning_rate=1e-4)

    assert isinstance(result, art.TrainResult)
    assert result.step == 1 and model.step == 1 and await model.get_step() == 1
    assert result.metrics["trained"] == 1.0 and result.metrics["learning_rate"] == 1e-4
    assert result.metrics["groups/trainable"] == 2 and result.metrics["trained_tokens"] > 0
    assert result.checkpoint_path is not None and result.checkpoint_path.endswith("0001")
    # ART's default loss, recorded in the step's history row.
    (row,) = [r for r in await backend.history(model) if r["type"] == "train"]
    assert row["loss"]["name"] == "cispo" and row["loss"]["ratio_level"] == "token"
    assert (row["loss"]["eps_low"], row["loss"]["eps_high"]) == (1.0, 4.0)
    # The new step is served.
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert response.model == f"{model.name}@1"


async def test_loss_fn_and_importance_sampling_level_reach_the_server(
    backend: art.RemoteBackend, model: art.TrainableModel
):
    groups = await trained_groups(model)
    result = await backend.train(
        model,
        groups,
        learning_rate=1e-4,
        loss_fn="ppo",
        importance_sampling_level="sequence",
        kl_penalty_coef=0.1,
        save_checkpoint=False,
    )
    assert result.step == 1 and result.checkpoint_path is None
    assert "kl_policy_ref" in result.metrics  # the KL-shaped advantages ran, with a reference
    # Fresh rollouts, exact tokens: the sequence ratio is 1 before the update.
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    (row,) = [r for r in await backend.history(model) if r["type"] == "train"]
    loss = row["loss"]
    assert (loss["name"], loss["objective"], loss["ratio_level"]) == ("ppo", "ppo_clip", "sequence")
    assert (loss["eps_low"], loss["eps_high"], loss["kl_penalty_coef"]) == (0.2, 0.2, 0.1)


async def test_log_after_train_does_not_count_the_step_twice(
    backend: art.RemoteBackend, model: art.TrainableModel
):
    groups = await trained_groups(model)
    result = await backend.train(model, groups, learning_rate=1e-4)
    logged = await model.log(
        groups, metrics={**result.metrics, "my/extra": 7.0}, step=result.step, split="train"
    )

    rows = await backend.history(model)
    assert [r["type"] for r in rows].count("train") == 1  # the step is counted once
    log_row = rows[-1]
    assert (log_row["type"], log_row["split"], log_row["step"]) == ("log", "train", 1)
    # The train row already holds the step's metrics and trajectories: the log adds only news.
    assert log_row["metrics"] == {"my/extra": 7.0}
    assert "loss" in log_row["already_recorded"]["metrics"]
    assert log_row["already_recorded"]["trajectories"] == 8
    assert logged["step"] == 1 and logged["metrics"] == {"my/extra": 7.0}


async def test_log_before_train_and_metrics_only_logs(model: art.TrainableModel):
    groups = await trained_groups(model)
    # ART's documented order: log the groups at the current step, train, then log metrics.
    before = await model.log(groups, split="train")
    assert before["step"] == 0 and before["metrics"]["trajectories"] == 8
    assert "already_recorded" not in before
    result = await model.backend.train(model, groups, learning_rate=1e-4)
    only_metrics = await model.log(metrics={"eval/score": 0.5}, step=result.step)
    assert only_metrics == {"step": 1, "split": "val", "metrics": {"eval/score": 0.5}}
    # A step the model has not reached, and an empty log, are refused with what to do.
    with pytest.raises(art.BackendRequestError, match="ahead of the model's step 1"):
        await model.log(metrics={"x": 1.0}, step=5)
    with pytest.raises(art.BackendRequestError, match="Nothing to log"):
        await model.log()


async def test_unknown_and_unsupported_keywords_are_named_errors(
    backend: art.RemoteBackend, model: art.TrainableModel
):
    with pytest.raises(art.UnknownFieldError, match="importance_sampling_level") as caught:
        await backend.train(model, [], importance_sampling_lvl="sequence")
    assert "loss_fn" in caught.value.known  # the message lists the known keywords
    with pytest.raises(art.UnsupportedOptionError, match="loss_fn"):
        await backend.train(model, [], loss_fn="dro")
    with pytest.raises(art.UnsupportedOptionError, match="not both"):
        await backend.train(model, [], art.TrainConfig(), learning_rate=1e-4)
    assert model.step == 0 and await model.get_step() == 0  # nothing was sent


async def test_the_config_forms_still_train(backend: art.RemoteBackend, model: art.TrainableModel):
    groups = await trained_groups(model)
    first = await backend.train(model, groups, art.TrainConfig(learning_rate=1e-4))
    assert first.step == 1 and first.metrics["learning_rate"] == 1e-4
    groups = await trained_groups(model)
    second = await model.train(groups, config=art.TrainConfig(learning_rate=2e-4, loss="gspo"))
    assert second.step == 2 and model.step == 2
    rows = [r for r in await backend.history(model) if r["type"] == "train"]
    assert [r["loss"]["name"] for r in rows] == ["grpo", "gspo"]


class AgentConfig(BaseModel):
    """A user's own model config, as ART stores it on the model."""

    temperature: float = 0.7


async def test_art_model_fields(backend: art.RemoteBackend, tiny_model_dir):
    prompted = art.Model(
        name="judge",
        project="tests",
        inference_api_key="key",
        inference_base_url="http://127.0.0.1:1/v1",
        inference_model_name="judge-v2",
    )
    assert (prompted.inference_base_url, prompted.inference_api_key) == (
        "http://127.0.0.1:1/v1", "key",
    )  # fmt: skip
    assert prompted.get_inference_name() == "judge-v2"
    with pytest.raises(art.UnsupportedOptionError, match="one option"):
        art.Model(name="x", base_url="http://a/v1", inference_base_url="http://b/v1")

    trainable = art.TrainableModel(
        name="agent-config",
        run_name="agent-config",
        project="tests",
        base_model=str(tiny_model_dir),
        config=AgentConfig(temperature=0.2),
        lora_config={"rank": 8, "alpha": 16},
    )
    assert trainable.config == AgentConfig(temperature=0.2)
    assert (trainable.lora_config.r, trainable.lora_config.alpha) == (8, 16)
    await trainable.register(backend)
    assert trainable.step == 0
    # ART's run_name: the trackers' run identity; the server still stores and serves `name`.
    assert art.TrainableModel(name="a", run_name="b", base_model="m").run_name == "b"
    with pytest.raises(art.UnsupportedOptionError, match="use_rslora"):
        art.TrainableModel(name="a", base_model="m", lora_config={"rank": 8, "use_rslora": True})
    with pytest.raises(TypeError, match="pydantic"):
        art.TrainableModel(name="a", base_model="m", config={"temperature": 1})  # type: ignore[arg-type]
