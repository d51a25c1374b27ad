"""AutoRL end to end: generated scenarios, rollouts on our backend, RULER rewards, training,
held-out evaluation and the report. The generator and judge are the scripted server (real HTTP,
real openai client), so every score is known; the policy is the tiny model on our backend."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_core.rewards import RunSettings
from tests.support.scripted_judge import Reply, ScriptedJudge, responder, scores_json

TASK = "Answer short questions about the opening hours and services of a bike shop."


async def test_autorl_generates_trains_evaluates_and_reports(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    remote_backend: art.RemoteBackend,
    tiny_model_dir: Path,
    tmp_path: Path,
):
    scripted_judge.default = responder
    model = art.TrainableModel(
        name=f"autorl-{uuid.uuid4().hex[:6]}", project="tests", base_model=str(tiny_model_dir)
    )
    await model.register(remote_backend)
    result = await art.autorl(
        TASK,
        model,
        judge=judge_model,
        steps=2,
        groups_per_step=2,
        rollouts_per_group=3,
        num_scenarios=8,
        max_tokens=8,
        config=art.TrainConfig(learning_rate=1e-4),
        judge_options={"cache": False},
        report_dir=tmp_path / "report",
        show_progress=False,
    )
    assert len(result.train_scenarios) == 6 and len(result.val_scenarios) == 2
    assert [r.step for r in result.steps] == [1, 2] and await model.get_step() == 2
    assert result.warnings == [] and result.settings["trained_steps"] == 2
    for step in result.steps:
        assert step.metrics["groups/submitted"] == 2
        assert step.metrics["judge/requests"] == 2  # one judgement per group
    assert result.before.step == 0 and result.after.step == 2
    assert 0 <= result.after.metrics["reward"] <= 1
    # the last answer is shown second in the forward order, first in the reverse one: the
    # scripted judge favours the later run, so the two orders cancel out exactly
    assert result.win_rate == pytest.approx(0.5)
    # 1 generation + 2x2 held-out singles + 4 groups + 2 pairs, each judged in both orders
    # unless its first and last answers are identical (then once: identical runs merge)
    assert 1 + 4 + 4 + 2 <= result.judge_usage.requests <= 1 + 4 + 4 + 4
    assert (tmp_path / "report" / "report.html").exists()
    assert "win_rate_vs_start" in (tmp_path / "report" / "report.html").read_text()


async def test_autorl_refuses_too_few_scenarios_to_split(
    judge_model: art.Model, model: art.TrainableModel
):
    scenarios = [art.Scenario(task="Only one scenario here.", difficulty=1)]
    with pytest.raises(ValueError, match="raise num_scenarios"):
        await art.autorl(TASK, model, judge=judge_model, scenarios=scenarios, show_progress=False)


async def test_autorl_says_when_the_judge_cannot_tell_runs_apart(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    model: art.TrainableModel,
):
    scripted_judge.default = judging(lambda runs: Reply(scores_json(*[0.4] * runs)))
    result = await small_autorl(model, judge_model, steps=1)
    assert result.steps[0].metrics["groups/zero_variance"] == 2
    assert result.settings["trained_steps"] == 0
    assert "same score in 2 of 2 groups" in result.warnings[0]


async def test_a_step_whose_groups_the_judge_all_drops_is_skipped_and_counted(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    model: art.TrainableModel,
):
    # Held-out answers (judged one at a time) are scored; no group is.
    scripted_judge.default = judging(
        lambda runs: Reply(scores_json(0.5) if runs == 1 else "no JSON here")
    )
    result = await small_autorl(model, judge_model, steps=2)
    assert result.steps == [] and await model.get_step() == 0  # nothing was sent to train
    assert result.settings["skipped_steps"] == 2 and result.settings["trained_steps"] == 0
    assert any("trained nothing" in warning for warning in result.warnings)


async def test_the_run_settings_come_as_one_object_or_as_keywords_not_both(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    model: art.TrainableModel,
):
    settings = RunSettings(steps=1, groups_per_step=2, rollouts_per_group=2, show_progress=False)
    with pytest.raises(ValueError, match=r"not both \(got settings= and steps\)"):
        await art.autorl(TASK, model, judge=judge_model, steps=3, settings=settings)
    scripted_judge.default = judging(lambda runs: Reply(scores_json(*[0.4] * runs)))
    result = await art.autorl(
        TASK, model, judge=judge_model, num_scenarios=4, max_tokens=4,
        judge_options={"cache": False}, settings=settings,
    )  # fmt: skip
    assert len(result.steps) == 1 and result.steps[0].metrics["groups/submitted"] == 2
    assert result.settings["steps"] == 1 and result.settings["rollouts_per_group"] == 2


def test_run_settings_are_the_keywords_left_off_their_defaults():
    assert RunSettings.given(None, "f()", steps=3, show_progress=True) == RunSettings(steps=3)
    given = RunSettings(steps=2)
    assert RunSettings.given(given, "f()", steps=10, config=None) is given  # defaults say nothing
    with pytest.raises(art.UnknownFieldError, match="did you mean 'steps'"):
        RunSettings.given(None, "f()", step=3)


def judging(judge_runs: Callable[[int], Reply]) -> Callable[[dict[str, Any]], Reply]:
    """A scripted judge that writes scenarios as usual and answers a judgement of N runs with
    `judge_runs(N)`."""

    def reply(body: dict[str, Any]) -> Reply:
        if body["response_format"]["json_schema"]["name"] == "scenarios":
            return responder(body)
        return judge_runs(len(body["response_format"]["json_schema"]["schema"]["required"]))

    return reply


async def small_autorl(
    model: art.TrainableModel, judge_model: art.Model, *, steps: int
) -> art.AutoRLResult:
    """AutoRL at its smallest: 4 scenarios, groups of 2, 4 tokens an answer, no judge cache."""
    return await art.autorl(
        TASK,
        model,
        judge=judge_model,
        steps=steps,
        groups_per_step=2,
        rollouts_per_group=2,
        num_scenarios=4,
        max_tokens=4,
        judge_options={"cache": False},
        show_progress=False,
    )
