"""The training API as a user drives it, against RemoteBackend and LocalBackend alike."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import openai
import pytest
from pydantic import ValidationError

import art_core as art
from tests.support.rollouts import answer_rollout, groups_for, varied_group

QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]


async def test_register_serves_step_zero(model: art.TrainableModel):
    assert model.step == 0
    assert model.get_inference_name() == f"{model.name}@0"
    served = await model.openai_client().models.list()
    assert model.get_inference_name() in [m.id for m in served.data]
    assert await model.get_step() == 0


async def test_train_step_advances_serves_next_step_and_reports_metrics(
    model: art.TrainableModel,
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))

    assert result.step == 1 and model.step == 1
    metrics = result.metrics
    assert metrics["groups/submitted"] == 2 and metrics["groups/trainable"] == 2
    assert metrics["rows"] == 8 and metrics["trained_tokens"] > 0
    assert metrics["reward"] == pytest.approx(1.5)  # rewards 0, 1, 2, 3 in each group
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # exact tokens and logprobs
    # A group's 4 rollouts share their prompt: the packed forward runs it once, not 4 times
    # (and the ratio above, on the packed forward, still matches the sampler's logprobs).
    assert metrics["shared_prefix_tokens"] > 0
    for key in ("loss", "entropy", "grad_norm", "clip_fraction", "trainer_tokens_per_second"):
        assert key in metrics
    # The new step is served and answers.
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert response.model == f"{model.name}@1"


async def test_training_changes_the_served_policy(model: art.TrainableModel):
    prompt = [{"role": "user", "content": "What is 1 + 1?"}]

    async def logprobs(step: int) -> list[float]:
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(step), messages=prompt, max_tokens=6,  # type: ignore[arg-type]
            temperature=0.0, logprobs=True,
        )  # fmt: skip
        choice_logprobs = response.choices[0].logprobs
        assert choice_logprobs is not None and choice_logprobs.content is not None
        return [entry.logprob for entry in choice_logprobs.content]

    before = await logprobs(0)
    groups = varied_group(await groups_for(model, QUESTIONS))
    await model.train(groups, config=art.TrainConfig(learning_rate=5e-3))
    assert await logprobs(1) != before


async def test_plain_dict_assistant_messages_matching_no_completion_are_counted_and_warned(
    model: art.TrainableModel, caplog: pytest.LogCaptureFixture
):
    groups = [
        art.TrajectoryGroup(
            art.Trajectory(
                messages_and_choices=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": f"hello {i}"},
                ],
                reward=float(i),
            )
            for i in range(3)
        )
    ]
    with caplog.at_level(logging.WARNING, logger="art_core"):
        result = await model.train(groups)
    assert result.metrics["context_assistant_messages"] == 3
    assert result.metrics["dropped/unmatched_assistant_messages"] == 3
    assert result.metrics["dropped/no_trainable_turns"] == 3
    assert result.metrics["trained"] == 0 and result.step == 0
    assert "match no completion" in result.warnings[0]
    assert "Nothing trained" in result.warnings[1]


async def test_group_of_one_and_zero_variance_groups_are_counted_not_trained(
    model: art.TrainableModel,
):
    lone = await groups_for(model, ["What is 5 + 5?"], per_group=1)
    flat = await groups_for(model, ["What is 6 + 6?"], reward=lambda _: 1.0)
    result = await model.train([*lone, *flat])
    assert result.metrics["groups/too_small"] == 1
    assert result.metrics["groups/zero_variance"] == 1
    assert result.metrics["groups/trainable"] == 0
    assert result.step == 0
    assert "groups/zero_variance" in result.warnings[0]


async def test_unknown_completion_id_is_a_counted_drop(model: art.TrainableModel):
    groups = varied_group(await groups_for(model, QUESTIONS))
    choice = groups[0].trajectories[0].messages_and_choices[-1]
    choice.completion_id = "chatcmpl-unknown"  # as if served by another backend
    result = await model.train(groups)
    assert result.metrics["dropped/unknown_completion"] == 1
    assert result.metrics["dropped/no_trainable_turns"] == 1
    assert result.step == 1  # the rest trained
    assert any("no record" in warning for warning in result.warnings)


async def test_over_length_rows_are_counted(model: art.TrainableModel):
    groups = varied_group(await groups_for(model, QUESTIONS))
    result = await model.train(groups, config=art.TrainConfig(max_length=4))
    assert result.metrics["dropped/over_length"] == 8
    assert result.metrics["trained"] == 0


async def test_truncated_completions_can_be_masked(model: art.TrainableModel):
    groups = varied_group(await groups_for(model, QUESTIONS, max_tokens=2))
    result = await model.train(groups, config=art.TrainConfig(mask_truncated=True))
    truncated = result.metrics["dropped/truncated"]
    assert truncated >= 1 and result.metrics["rows"] == 8 - truncated


def test_nan_reward_is_refused_where_it_is_set():
    with pytest.raises(ValidationError, match="finite"):
        art.Trajectory(messages_and_choices=[], reward=float("nan"))
    trajectory = art.Trajectory(messages_and_choices=[])
    with pytest.raises(ValidationError, match="finite"):
        trajectory.reward = float("inf")


async def test_unregistered_and_untrainable_models_fail_clearly(tiny_model_dir: Path):
    unregistered = art.TrainableModel(name="never", base_model=str(tiny_model_dir))
    with pytest.raises(art.ModelNotRegisteredError, match="register"):
        await unregistered.train([])
    prompted = art.Model(name="judge", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(art.NotTrainableError, match="TrainableModel"):
        await prompted.train([])


def test_misspelt_train_option_is_an_error():
    # More cases, and the keyword form `model.train(groups, learning_rat=...)`, in
    # test_unknown_fields.py.
    with pytest.raises(art.UnknownFieldError, match="did you mean 'learning_rate'"):
        art.TrainConfig(learning_rat=1e-5)  # type: ignore[call-arg]


async def test_wrong_base_model_is_a_clear_error(backend: art.RemoteBackend, tiny_model_dir: Path):
    await art.TrainableModel(name="first", base_model=str(tiny_model_dir)).register(backend)
    other = art.TrainableModel(name="other-base", base_model="some/other-model")
    with pytest.raises(art.ArtError, match="base model"):
        await other.register(backend)


async def test_log_writes_history_and_trajectories(model: art.TrainableModel):
    groups = await groups_for(model, QUESTIONS, reward=lambda text: 1.0 if text else 0.0)
    logged = await model.log(groups, split="val")
    assert logged["step"] == 0 and logged["metrics"]["trajectories"] == 8
    rows = await model.backend.history(model)  # type: ignore[attr-defined]
    assert rows[-1]["type"] == "log" and rows[-1]["split"] == "val"


async def test_delete_checkpoints_keeps_latest_and_best(model: art.TrainableModel):
    for reward in (0.1, 0.9, 0.2):  # val reward logged at steps 0, 1, 2
        await model.log(
            [art.TrajectoryGroup([art.Trajectory(messages_and_choices=[], reward=reward)])]
        )
        groups = varied_group(await groups_for(model, QUESTIONS))
        await model.train(groups)
    result = await model.delete_checkpoints("val/reward")
    assert result["best_step"] == 1
    assert result["kept"] == [1, 3] and result["deleted"] == [0, 2]


async def test_delete_chosen_steps_never_the_latest(model: art.TrainableModel):
    for _ in range(3):
        await model.train(varied_group(await groups_for(model, QUESTIONS)))
    backend = model.backend
    assert await backend.checkpoint_steps(model) == [0, 1, 2, 3]
    with pytest.raises(art.BackendRequestError, match="latest step"):
        await backend.delete_checkpoint_steps(model, [1, 3])
    with pytest.raises(art.BackendRequestError, match=r"no checkpoint for step\(s\) \[7\]"):
        await backend.delete_checkpoint_steps(model, [0, 7])
    assert await backend.checkpoint_steps(model) == [0, 1, 2, 3]  # a refused request deletes none
    result = await backend.delete_checkpoint_steps(model, [0, 2])
    assert result["deleted"] == [0, 2] and result["kept"] == [1, 3]
    assert await backend.checkpoint_steps(model) == [1, 3]
    served = [m.id for m in (await model.openai_client().models.list()).data]
    assert f"{model.name}@2" not in served and f"{model.name}@3" in served


async def test_served_steps_keeps_older_steps_loaded(model: art.TrainableModel):
    async def served() -> set[str]:
        names = [m.id for m in (await model.openai_client().models.list()).data]
        return {name for name in names if name.startswith(f"{model.name}@")}

    await model.backend.register(model, served_steps=3)  # resumes, widens the window
    for _ in range(3):
        await model.train(varied_group(await groups_for(model, QUESTIONS)))
    assert await served() == {f"{model.name}@{step}" for step in (1, 2, 3)}
    await model.backend.register(model, served_steps=1)  # narrowing unloads at once
    assert await served() == {f"{model.name}@3"}
    with pytest.raises(art.BackendRequestError, match="served_steps") as refused:
        await model.backend.register(model, served_steps=0)
    assert refused.value.status_code == 400


async def test_one_name_cannot_be_served_for_two_projects(model: art.TrainableModel):
    twin = art.TrainableModel(name=model.name, project="other", base_model=model.base_model)
    with pytest.raises(art.BackendRequestError, match="another name") as refused:
        await twin.register(model.backend)
    assert refused.value.status_code == 409


async def test_zero_change_rollout_capture_trains(model: art.TrainableModel):
    trajectories = []
    sampled_tokens = 0
    for reward in (0.0, 1.0, 2.0):
        async with model.rollout() as capture:
            # A stock client that only changes base_url: nothing ART-specific in the agent.
            client = openai.AsyncOpenAI(base_url=capture.base_url, api_key=capture.api_key)
            messages: list = [{"role": "user", "content": "Count to three."}]
            first = await client.chat.completions.create(
                model=capture.model, messages=messages, max_tokens=4
            )
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "Again."},
            ]
            second = await client.chat.completions.create(
                model=capture.model, messages=messages, max_tokens=4
            )
            capture.reward = reward
        sampled_tokens += first.usage.completion_tokens + second.usage.completion_tokens  # type: ignore[union-attr]
        trajectory = capture.trajectory
        assert trajectory.reward == reward
        assert [m["role"] for m in trajectory.messages()] == [
            "user", "assistant", "user", "assistant",
        ]  # fmt: skip
        assert not trajectory.additional_histories  # the second call extends the first
        trajectories.append(trajectory)
    result = await model.train([art.TrajectoryGroup(trajectories)])
    assert result.step == 1
    # Every sampled token trains exactly once. (The random tiny model's text does not always
    # re-tokenize to the sampled ids, so a second turn may form its own row: 3 to 6 rows.)
    assert result.metrics["trained_tokens"] == sampled_tokens
    assert 3 <= result.metrics["rows"] <= 6


async def test_sft_warm_start_lowers_the_loss(model: art.TrainableModel):
    examples = [
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": f"What is {i} + 1?"},
                {"role": "assistant", "content": str(i + 1)},
            ]
        )
        for i in range(6)
    ]
    result = await model.train_sft(
        examples, config=art.TrainSFTConfig(learning_rate=1e-2, batch_size=3, epochs=4)
    )
    assert result.step == 1
    assert result.metrics["optimizer_steps"] == 8
    assert result.metrics["loss"] < result.metrics["loss_first"]


async def test_second_train_is_queued_and_the_caller_is_told(
    model: art.TrainableModel, caplog: pytest.LogCaptureFixture
):
    first = varied_group(await groups_for(model, QUESTIONS))
    second = varied_group(await groups_for(model, QUESTIONS))
    slow = art.TrainConfig(micro_batch_tokens=16)  # one row per micro-batch: a longer step
    with caplog.at_level(logging.WARNING, logger="art_core"):
        results = await asyncio.gather(model.train(first, slow), model.train(second, slow))
    assert sorted(r.step for r in results) == [1, 2]
    assert "queued" in caplog.text


async def test_inference_keeps_serving_during_training(model: art.TrainableModel):
    groups = varied_group(await groups_for(model, QUESTIONS * 3))
    client = model.openai_client()
    name = model.get_inference_name()

    async def chat() -> str:
        response = await client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        return response.choices[0].finish_reason

    training = asyncio.create_task(model.train(groups, art.TrainConfig(micro_batch_tokens=16)))
    finishes = await asyncio.gather(*(chat() for _ in range(6)))
    await training
    assert all(reason in ("stop", "length") for reason in finishes)


async def test_fork_starts_from_the_source_checkpoint(
    model: art.TrainableModel, backend: art.RemoteBackend
):
    await model.train(varied_group(await groups_for(model, QUESTIONS)))
    fork = art.TrainableModel(
        name=f"{model.name}-fork", project="tests", base_model=model.base_model
    )
    await fork.register(backend, fork_from=model)
    assert fork.step == 1
    prompt = [{"role": "user", "content": "What is 1 + 1?"}]

    async def answer(m: art.TrainableModel) -> str | None:
        response = await m.openai_client().chat.completions.create(
            model=m.get_inference_name(),
            messages=prompt,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0.0,
        )
        return response.choices[0].message.content

    assert await answer(fork) == await answer(model)


async def test_zero_variance_in_denominator_counts_the_all_equal_groups_tokens(
    model: art.TrainableModel,
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    for trajectory in groups[1].trajectories:  # the second group: all-equal, does not train
        trajectory.reward = 1.0
    result = await model.train(groups, zero_variance_in_denominator=True)
    assert result.metrics["groups/zero_variance"] == 1 and result.metrics["groups/trainable"] == 1
    [row] = [r for r in await model.backend.history(model) if r["type"] == "train"]
    loss = row["loss"]
    assert loss["untrained_rows"] == len(groups[1].trajectories)
    assert loss["untrained_tokens"] >= loss["untrained_rows"]  # every answer has a token


async def test_rollout_helper_returns_a_trajectory(model: art.TrainableModel):
    trajectory = await answer_rollout(model, "What is 1 + 1?")
    assert trajectory.messages()[-1]["role"] == "assistant"


@pytest.mark.parametrize(
    ("config", "expected_metric"),
    [
        (art.TrainConfig(beta=0.1), "kl"),
        (art.TrainConfig(loss="gspo"), "clip_fraction"),
        (art.TrainConfig(loss="cispo"), "clip_fraction"),
        (art.TrainConfig(loss="dr_grpo", max_completion_length=8), "clip_fraction"),
        (art.TrainConfig(gradient_checkpointing=True), "grad_norm"),
    ],
    ids=["kl", "gspo", "cispo", "dr_grpo", "gradient_checkpointing"],
)
async def test_loss_options_train_and_serving_goes_on(
    model: art.TrainableModel, config: art.TrainConfig, expected_metric: str
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    result = await model.train(groups, config=config)
    assert result.step == 1 and expected_metric in result.metrics
    assert result.metrics["grad_norm"] > 0
    if config.beta:
        assert result.metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # adapter starts at zero
    # The engine's mixed-adapter forward still works after the trainer's forward.
    after = await answer_rollout(model, "What is 1 + 1?")
    assert after.messages()[-1]["role"] == "assistant"
