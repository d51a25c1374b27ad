"""The promotion gate: a step whose held-out metric drops is trained and kept, but not promoted
(by `model.train(groups, promote_if=gate)` and by a `PipelineTrainer(..., promote_if=gate)`).

The held-out evaluation makes real requests to the step under test (`name@N`); its reward is
rigged by step, so the drop comes exactly where a test puts it.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file

import art_core as art
from art_core.pipeline_trainer import PipelineTrainer
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import running_server

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
TRAIN_QUESTIONS = ["What is 1 + 2?", "What is 3 + 4?"]
LEARNING_RATE = 5e-3  # large enough that one step visibly moves the tiny adapter


class RiggedHeldOut:
    """A held-out evaluation of `name@step`: real answers, reward 0.8, or 0.2 at `drops_at`."""

    def __init__(self, drops_at: Collection[int] = (), *, fails_at: Collection[int] = ()):
        self.drops_at, self.fails_at = drops_at, fails_at
        self.answered_by: dict[int, str] = {}

    async def __call__(self, model: art.TrainableModel, step: int) -> list[art.TrajectoryGroup]:
        if step in self.fails_at:
            raise ConnectionError("the held-out judge is down")
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(step), messages=QUESTION, max_tokens=4  # type: ignore[arg-type]
        )  # fmt: skip
        self.answered_by[step] = response.model
        reward = 0.2 if step in self.drops_at else 0.8
        trajectory = art.Trajectory(
            messages_and_choices=[*QUESTION, response.choices[0]],
            reward=reward,
            metrics={"answer_length": float(len(response.choices[0].message.content or ""))},
        )
        return [art.TrajectoryGroup([trajectory])]


class Recorder:
    """A tracker: the results of the steps it is told of (what W&B or Trackio would log)."""

    def __init__(self) -> None:
        self.results: list[art.TrainResult | None] = []

    def step_metrics(self, model: Any) -> dict[str, float]:
        return {}

    def step_started(self, model, groups, *, split, step, options):  # type: ignore[no-untyped-def]
        return self.results.append if split == "train" else None


async def train_step(model: art.TrainableModel, gate: art.PromotionGate) -> art.TrainResult:
    groups = varied_group(await groups_for(model, TRAIN_QUESTIONS))
    return await model.train(groups, learning_rate=LEARNING_RATE, promote_if=gate)


async def plain_name_answers_from(model: art.TrainableModel) -> str:
    response = await model.openai_client().chat.completions.create(
        model=model.name, messages=QUESTION, max_tokens=2  # type: ignore[arg-type]
    )  # fmt: skip
    return response.model


def adapter(result: art.TrainResult) -> dict[str, np.ndarray]:
    assert result.checkpoint_path is not None
    return load_file(str(Path(result.checkpoint_path) / "adapter_model.safetensors"))


def distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return math.sqrt(sum(float(np.sum((a[key] - b[key]) ** 2)) for key in a))


async def promotion_rows(model: art.TrainableModel) -> list[dict[str, Any]]:
    return [row for row in await model.backend.history(model) if row["type"] == "promotion"]


# ------------------------------------------------------------------------------ the behaviour


async def test_a_step_whose_held_out_reward_drops_is_kept_but_not_promoted(
    model: art.TrainableModel,
):
    held_out = RiggedHeldOut(drops_at={2})
    recorder = Recorder()
    model.observers.append(recorder)
    gate = art.PromotionGate(evaluate=held_out, metric="reward", margin=0.05)

    first = await train_step(model, gate)  # the baseline (step 0) first, then step 1: held
    assert (first.step, first.promoted_step) == (1, 1)
    assert first.metrics["gate/promoted"] == 1.0 and first.metrics["gate/refused_total"] == 0.0
    second = await train_step(model, gate)

    # Step 2 trained and on disk, but the plain name and get_inference_name() stay on step 1.
    assert (second.step, second.promoted_step) == (2, 1)
    assert model.step == 2 and model.promoted_step == 1
    assert model.get_inference_name() == f"{model.name}@1"
    assert model.get_inference_name(2) == f"{model.name}@2"
    assert await plain_name_answers_from(model) == f"{model.name}@1"
    assert 2 in await model.backend.checkpoint_steps(model)
    # The evaluation answered from the step under test, not from the plain name.
    assert held_out.answered_by == {s: f"{model.name}@{s}" for s in (0, 1, 2)}

    # Counted in the step's metrics, which the trackers see ...
    assert second.metrics["gate/promoted"] == 0.0 and second.metrics["gate/refused"] == 1.0
    assert second.metrics["gate/refused_total"] == 1.0
    assert second.metrics["gate/value"] == pytest.approx(0.2)
    assert second.metrics["gate/best"] == pytest.approx(0.8)
    assert recorder.results == [first, second]
    # ... and in the history: each step's metric, the best so far, promoted or not.
    rows = await promotion_rows(model)
    assert [(r["step"], r["promoted"], r["promoted_step"]) for r in rows] == [
        (1, True, 1),
        (2, False, 1),
    ]
    assert rows[1]["metric"] == "reward" and rows[1]["best_step"] == 1
    assert rows[1]["metrics"]["gate/value"] == pytest.approx(0.2)
    assert rows[1]["metrics"]["gate/best"] == pytest.approx(0.8)
    trained = [r for r in await model.backend.history(model) if r["type"] == "train"]
    assert [r["promoted_step"] for r in trained] == [0, 1]

    # The review page marks it beside the rollouts that trained it (sampled at step 1).
    server = str(model.inference_base_url).removesuffix("/v1")
    key = {"Authorization": f"Bearer {model.inference_api_key}"} if model.inference_api_key else {}
    page = httpx.get(f"{server}/review/{model.project}/{model.name}/", headers=key).text
    assert page.count("not promoted") == 1 and "step 2 not promoted" in page

    # A later step that holds is promoted again: the plain name moves on.
    third = await train_step(model, gate)
    assert (third.step, third.promoted_step) == (3, 3)
    assert await plain_name_answers_from(model) == f"{model.name}@3"
    assert third.metrics["gate/refused_total"] == 1.0


@pytest.mark.parametrize("train_from", ["promoted", "latest"])
async def test_the_step_after_a_refusal_trains_from_the_promoted_or_the_latest_step(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, train_from: str
):
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=[])
    gate = art.PromotionGate(evaluate=RiggedHeldOut(drops_at={2, 3}), train_from=train_from)  # type: ignore[arg-type]
    step_1 = await train_step(model, gate)
    groups = varied_group(await groups_for(model, TRAIN_QUESTIONS))
    step_2 = await model.train(groups, learning_rate=LEARNING_RATE, promote_if=gate)
    assert step_2.promoted_step == 1
    # Step 3 on step 2's very groups: from step 1's adapter that is step 2 again; from step
    # 2's adapter it is one step further.
    step_3 = await model.train(groups, learning_rate=LEARNING_RATE, promote_if=gate)
    assert (step_3.step, step_3.promoted_step) == (3, 1)

    one_step = distance(adapter(step_2), adapter(step_1))
    assert one_step > 0
    from_step_2 = distance(adapter(step_3), adapter(step_2))
    history = await remote_backend.history(model)
    trained_from = {r["step"]: r["trained_from"] for r in history if r["type"] == "train"}
    if train_from == "promoted":
        assert trained_from == {1: 0, 2: 1, 3: 1}
        assert from_step_2 < 1e-3 * one_step
    else:
        assert trained_from == {1: 0, 2: 1, 3: 2}
        assert from_step_2 > 0.1 * one_step


async def test_a_lower_is_better_metric_read_from_the_trajectories(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=[])
    losses = {0: 1.0, 1: 0.9, 2: 1.5}

    async def held_out_loss(model: art.TrainableModel, step: int) -> float:
        return losses[step]

    gate = art.PromotionGate(evaluate=held_out_loss, metric="loss", higher_is_better=False)
    assert (await train_step(model, gate)).promoted_step == 1
    refused = await train_step(model, gate)
    assert refused.promoted_step == 1 and refused.metrics["gate/value"] == 1.5


async def test_a_pipeline_trained_through_the_gate_leaves_the_plain_name_on_step_1(
    model: art.TrainableModel,
):
    held_out = RiggedHeldOut(drops_at={2})
    recorder = Recorder()
    model.observers.append(recorder)

    async def rollout(model: art.TrainableModel, question: str, config: Any) -> art.TrajectoryGroup:
        return varied_group(await groups_for(model, [question], per_group=2))[0]

    trainer = PipelineTrainer(
        model, model.backend, rollout, TRAIN_QUESTIONS * 2, config=None,
        num_rollout_workers=1, min_batch_size=1, max_batch_size=1, max_steps=2,
        learning_rate=LEARNING_RATE, eval_at_start=False,
        promote_if=art.PromotionGate(evaluate=held_out, margin=0.05),
    )  # fmt: skip
    await trainer.train(handle_signals=False)

    # Step 2 trained and kept, but the plain name stays on step 1.
    assert model.step == 2 and model.promoted_step == 1
    assert await plain_name_answers_from(model) == f"{model.name}@1"
    assert held_out.answered_by.keys() == {0, 1, 2}
    assert trainer.state.refused_promotions == 1
    # The gate's counts are in the step metrics the trackers see, beside the pipeline's own.
    first, second = recorder.results
    assert first is not None and second is not None
    assert first.metrics["gate/promoted"] == 1.0 and second.metrics["gate/refused"] == 1.0
    assert second.metrics["gate/value"] == pytest.approx(0.2)
    assert "discarded/step/stale_groups" in second.metrics
    rows = await promotion_rows(model)
    assert [(r["step"], r["promoted"], r["promoted_step"]) for r in rows] == [
        (1, True, 1),
        (2, False, 1),
    ]


def test_a_pipeline_gate_must_be_a_gate(model: art.TrainableModel):
    with pytest.raises(TypeError, match=r"promote_if must be an art\.PromotionGate"):
        PipelineTrainer(model, model.backend, None, [], config=None, promote_if=0.5)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"margin": -0.1}, "margin must be a finite number >= 0"),
        ({"margin": math.nan}, "margin must be a finite number >= 0"),
        ({"margin": "5%"}, "margin must be a number"),
        ({"metric": ""}, "metric must be a metric name"),
        ({"train_from": "best"}, "train_from must be 'promoted' or 'latest'"),
        ({"evaluate": 0.5}, "evaluate must be an async function"),
    ],
    ids=["negative-margin", "nan-margin", "margin-a-string", "empty-metric", "unknown-train-from",
         "evaluate-not-callable"],
)  # fmt: skip
def test_bad_gate_settings_are_named_errors(options: dict, words: str):
    with pytest.raises(art.PromotionGateError, match=words):
        art.PromotionGate(**{"evaluate": RiggedHeldOut(), **options})


def test_the_gate_goes_to_the_call_not_into_the_train_config():
    gate = art.PromotionGate(evaluate=RiggedHeldOut())
    with pytest.raises(art.UnknownFieldError, match=r"model.train\(groups, promote_if="):
        art.TrainConfig(promote_if=gate)  # type: ignore[call-arg]


async def test_promote_if_must_be_a_gate(model: art.TrainableModel):
    with pytest.raises(TypeError, match=r"promote_if must be an art\.PromotionGate"):
        await model.train([], promote_if=lambda model, step: 1.0)  # type: ignore[arg-type]
    assert await model.get_step() == 0


async def test_an_unknown_metric_stops_the_call_before_anything_trains(model: art.TrainableModel):
    gate = art.PromotionGate(evaluate=RiggedHeldOut(), metric="accuracy")
    with pytest.raises(art.PromotionGateError, match="unknown metric 'accuracy'") as caught:
        await train_step(model, gate)
    assert "its metrics are answer_length, reward" in str(caught.value).lower()
    assert "nothing was trained" in str(caught.value)
    assert await model.get_step() == 0


async def test_an_evaluation_that_raises_leaves_the_step_trained_but_not_promoted(
    model: art.TrainableModel,
):
    gate = art.PromotionGate(evaluate=RiggedHeldOut(fails_at={1}))
    with pytest.raises(art.PromotionGateError) as caught:
        await train_step(model, gate)
    message = str(caught.value)
    assert "evaluate raised at step 1: ConnectionError: the held-out judge is down" in message
    assert "not promoted" in message and "still serves step 0" in message
    assert isinstance(caught.value.__cause__, ConnectionError)
    # Recorded, not lost: the step, its counts, the history row with the error.
    result = caught.value.result
    assert result is not None and (result.step, result.promoted_step) == (1, 0)
    assert result.metrics["gate/evaluate_errors"] == 1.0 and result.metrics["gate/refused"] == 1.0
    assert model.step == 1 and model.get_inference_name() == f"{model.name}@0"
    assert await plain_name_answers_from(model) == f"{model.name}@0"
    [row] = await promotion_rows(model)
    assert row["promoted"] is False and "the held-out judge is down" in row["error"]


@pytest.mark.parametrize(
    ("returned", "words"),
    [
        ("0.9", "must return a number or a list of art.TrajectoryGroup, got str"),
        (math.inf, "not a finite number"),
        ([art.TrajectoryGroup([])], "returned no trajectories"),
    ],
    ids=["a-string", "infinite", "no-trajectories"],
)
async def test_an_unusable_evaluation_is_a_named_error(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, returned: Any, words: str
):
    model = await fresh_model(remote_backend, tiny_model_dir, report_metrics=[])

    async def evaluate(model: art.TrainableModel, step: int) -> Any:
        return returned

    with pytest.raises(art.PromotionGateError, match=words):
        await train_step(model, art.PromotionGate(evaluate=evaluate))
    assert await model.get_step() == 0


async def test_a_restarted_server_keeps_the_plain_name_on_the_promoted_step(
    tiny_model_dir: Path, tmp_path: Path
):
    gate = art.PromotionGate(evaluate=RiggedHeldOut(drops_at={2}))
    with running_server(tiny_model_dir, tmp_path) as server:
        async with art.RemoteBackend(server.url) as backend:
            model = await fresh_model(backend, tiny_model_dir, report_metrics=[])
            await train_step(model, gate)
            assert (await train_step(model, gate)).promoted_step == 1
    with running_server(tiny_model_dir, tmp_path) as server:
        async with art.RemoteBackend(server.url) as backend:
            again = art.TrainableModel(
                name=model.name, project=model.project, base_model=model.base_model
            )
            await again.register(backend)
            assert (again.step, again.promoted_step) == (2, 1)
            assert await plain_name_answers_from(again) == f"{model.name}@1"
            # A new gate takes up the standing from the history: no new baseline evaluation.
            held_out = RiggedHeldOut()
            third = await train_step(again, art.PromotionGate(evaluate=held_out))
            assert held_out.answered_by.keys() == {3}
            assert third.metrics["gate/refused_total"] == 1.0 and third.promoted_step == 3
