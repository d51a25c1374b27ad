"""Preflight ("will this learn?"): each verdict produced by a real case on the tiny model served by
our backend, judges scripted over real HTTP with the real openai client, and `art preflight` end
to end in a subprocess."""

from __future__ import annotations

import collections
import itertools
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from tests.support.models import fresh_model
from tests.support.scripted_judge import Reply, ScriptedJudge, responder, scores_json

QUESTIONS = ["What is 2 + 3?", "Name a colour."]


def answering(
    reward: Callable[[str], float],
    *,
    temperature: float = 1.0,
    metrics: Callable[[str], dict[str, float]] | None = None,
) -> Callable[[art.Model, str], Any]:
    """A rollout: one sampled answer from the model, rewarded by `reward(answer)`."""

    async def rollout(model: art.Model, question: str) -> art.Trajectory:
        messages = [{"role": "user", "content": question}]
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=temperature,
        )
        choice = response.choices[0]
        text = choice.message.content or ""
        return art.Trajectory(
            messages_and_choices=[*messages, choice],
            reward=reward(text),
            metrics=metrics(text) if metrics else {},
        )

    return rollout


def every_run_different() -> Callable[[str], float]:
    """Rewards 0, 1/3, 2/3, 1, 0, ... in the order the runs finish: every group spreads."""
    counter = itertools.count()
    return lambda _text: (next(counter) % 4) / 3


def equal_scores(body: dict[str, Any]) -> Reply:
    """A judge that ties: every run of every group gets 50."""
    runs = len(body["response_format"]["json_schema"]["schema"]["required"])
    return Reply(scores_json(*[0.5] * runs))


@pytest.fixture
async def policy(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


async def test_a_spread_reward_is_likely_to_learn(policy: art.TrainableModel):
    # Counted per question (one group each), so every group gets 0, 1/3, 2/3 and 1 whatever
    # order the runs finish in: one shared counter made the spread depend on that order.
    counters: collections.defaultdict[str, itertools.count] = collections.defaultdict(
        itertools.count
    )

    async def rollout(model: art.Model, question: str) -> art.Trajectory:
        trajectory = await answering(lambda _text: 0.0)(model, question)
        trajectory.reward = (next(counters[question]) % 4) / 3
        return trajectory

    result = await art.preflight(policy, rollout, QUESTIONS, steps=5, groups_per_step=4)
    assert result.verdict == "likely to learn" and result.change is None and result.will_learn
    assert result.zero_variance_share == 0.0 and result.failed_rollouts == 0
    assert result.rollouts == 8 and result.reward_min == 0.0 and result.reward_max == 1.0
    assert result.reward_spread > 0.3
    assert result.judged is False and result.judge_tie_rate is None
    assert result.judge_position_gap is None
    # twice the groups per step as measured: the estimate is scaled, then times the steps
    assert result.seconds_per_step > 0
    assert result.expected_wall_seconds == pytest.approx(5 * result.seconds_per_step)
    assert "Verdict: likely to learn" in result.text() and str(result) == result.text()
    assert json.loads(result.to_json())["verdict"] == "likely to learn"


async def test_a_constant_reward_will_not_learn_and_asks_for_a_shaped_reward(
    policy: art.TrainableModel,
):
    result = await art.preflight(policy, answering(lambda _: 0.5), QUESTIONS)
    assert result.verdict == "will not learn: zero-variance groups"
    assert result.zero_variance_share == 1.0 and not result.will_learn
    assert result.change == "a shaped reward"
    assert "whatever it wrote" in result.text()


async def test_no_reward_at_all_asks_for_an_sft_warm_start(policy: art.TrainableModel):
    result = await art.preflight(policy, answering(lambda _: 0.0), QUESTIONS)
    assert result.verdict == "will not learn: zero-variance groups"
    assert result.change == "SFT warm start" and "train_sft" in result.advice


async def test_a_metric_that_differs_where_the_reward_does_not_names_the_metric(
    policy: art.TrainableModel,
):
    counter = itertools.count()
    result = await art.preflight(
        policy,
        answering(lambda _: 0.0, metrics=lambda _: {"partial": float(next(counter) % 2)}),
        QUESTIONS,
    )
    assert result.change == "a shaped reward"
    assert any("partial" in reason for reason in result.reasons)


async def test_identical_greedy_runs_ask_for_a_higher_temperature(policy: art.TrainableModel):
    result = await art.preflight(policy, answering(len, temperature=0.0), QUESTIONS)
    assert result.identical_run_share == 1.0
    assert result.verdict == "will not learn: zero-variance groups"
    assert result.change == "higher temperature"


async def test_flat_groups_beside_varied_ones_ask_for_a_larger_group(
    policy: art.TrainableModel,
):
    spread = every_run_different()

    async def rollout(model: art.Model, question: str) -> art.Trajectory:
        trajectory = await answering(spread)(model, question)
        if question == QUESTIONS[0]:  # the first task is never solved, the second sometimes
            trajectory.reward = 0.0
        return trajectory

    result = await art.preflight(policy, rollout, QUESTIONS)
    assert result.zero_variance_share == 0.5
    assert result.verdict == "may learn slowly: many zero-variance groups" and result.will_learn
    assert result.change == "larger group"
    assert any("art.GroupSignal(min_trainable_groups=N)" in reason for reason in result.reasons)


async def test_failing_rollouts_will_not_learn_and_show_the_error(policy: art.TrainableModel):
    async def broken(model: art.Model, question: str) -> art.Trajectory:
        raise RuntimeError("the tool server is down")

    result = await art.preflight(policy, broken, QUESTIONS)
    assert result.verdict == "will not learn: rollouts fail"
    assert result.failed_rollouts == 8 and result.change == "fix the rollout"
    assert "the tool server is down" in (result.first_error or "")


async def test_a_judge_that_ties_will_not_learn(
    policy: art.TrainableModel, scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = equal_scores
    result = await art.preflight(
        policy, answering(every_run_different()), QUESTIONS, judge=judge_model, steps=3
    )
    assert result.verdict == "will not learn: judge ties"
    assert result.change == "a better judge" and result.judged
    assert result.judge_tie_rate == 1.0 and result.judge_position_gap == 0.0
    # the judge's scores replace the rollouts' spread rewards
    assert result.reward_min == result.reward_max == 0.5
    # per step: one forward judgement per group, at 100 + 20 scripted tokens, $1/$4 per M
    judged_groups = len(scripted_judge.requests) // 2
    assert judged_groups == 2
    assert result.judge_tokens_per_step == pytest.approx(2 * 120)
    assert result.judge_cost_usd_per_step == pytest.approx(2 * (100 + 80) / 1e6)
    assert all(r["temperature"] == 0.0 for r in scripted_judge.requests)


async def test_a_judge_that_scores_by_position_is_unlikely_to_learn(
    policy: art.TrainableModel, scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = responder  # favours later runs, whatever they say
    result = await art.preflight(policy, answering(len), QUESTIONS, judge=judge_model)
    assert result.verdict == "unlikely to learn: judge position bias"
    assert result.change == "a better judge"
    assert result.judge_tie_rate == 0.0 and (result.judge_position_gap or 0) >= 0.2


async def test_impossible_inputs_are_named_errors(policy: art.TrainableModel):
    rollout = answering(len)
    with pytest.raises(art.PreflightError, match="at least one scenario"):
        await art.preflight(policy, rollout, [])
    with pytest.raises(art.PreflightError, match="rollouts_per_group must be an integer >= 2"):
        await art.preflight(policy, rollout, QUESTIONS, rollouts_per_group=1)
    with pytest.raises(art.PreflightError, match="groups must be"):
        await art.preflight(policy, rollout, QUESTIONS, groups=0)
    with pytest.raises(TypeError, match="group_size"):
        await art.preflight(policy, rollout, QUESTIONS, group_size=4)  # type: ignore[call-arg]
    with pytest.raises(art.UnknownFieldError, match="reverse_order"):
        await art.preflight(policy, rollout, QUESTIONS, judge_options={"reverse_order": True})


ROLLOUT_MODULE = """
import art_core as art


async def rollout(model, scenario):
    messages = [{"role": "user", "content": scenario["question"]}]
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_tokens=8, temperature=1.0
    )
    return art.Trajectory(messages_and_choices=[*messages, response.choices[0]], reward=0.0)
"""


def art_preflight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "art_core.cli", "preflight", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


async def test_the_command_runs_a_rollout_file_and_prints_json(
    policy: art.TrainableModel, tmp_path: Path
):
    (tmp_path / "my_agent.py").write_text(textwrap.dedent(ROLLOUT_MODULE))
    scenarios = tmp_path / "scenarios.jsonl"
    scenarios.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS))
    common = [
        "--scenarios", str(scenarios), "--base-url", str(policy.inference_base_url),
        "--model", policy.get_inference_name(), "--steps", "7",
    ]  # fmt: skip
    done = art_preflight(f"{tmp_path / 'my_agent.py'}:rollout", *common, "--json")
    assert done.returncode == 1, done.stderr  # a reward of 0 everywhere will not learn
    result = json.loads(done.stdout)
    assert result["verdict"] == "will not learn: zero-variance groups"
    assert result["change"] == "SFT warm start" and result["steps"] == 7
    assert result["rollouts"] == 8

    readable = art_preflight(f"{tmp_path / 'my_agent.py'}:rollout", *common)
    assert "Verdict: will not learn" in readable.stdout

    missing = art_preflight(f"{tmp_path / 'my_agent.py'}:no_such", *common)
    assert missing.returncode == 2 and "has no function 'no_such'" in missing.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    none = art_preflight(
        f"{tmp_path / 'my_agent.py'}:rollout", *common[:0], "--scenarios", str(empty),
        "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
    )  # fmt: skip
    assert none.returncode == 2 and "at least one scenario" in none.stderr


def test_the_command_is_listed():
    done = subprocess.run(
        [sys.executable, "-m", "art_core.cli", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "preflight" in done.stdout
