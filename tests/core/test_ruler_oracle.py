"""RULER against the oracle judge (`examples/oracle_judge.py`): the judge's ranking reaches the
gradient the right way round.

The oracle is a real OpenAI-compatible server on 127.0.0.1 that reads our RULER prompt and
scores each run by a hidden code check; the tiny model's rollouts are judged by it through
`ruler_score_group`, trained, and the advantages the server returns must order the runs as the
check does, and the other way round when the oracle is inverted.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import httpx
import openai
import pytest

import art_core as art
from art_core.rewards._ruler_prompt import build_judge_prompt, distinct_runs
from art_core.rewards.ruler import validate_scores
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTIONS = ["What is 2 + 2?", "Name a colour.", "Say hello."]


def load_example(name: str) -> ModuleType:
    """An example module by file (the examples folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


oracle = load_example("oracle_judge")


def answer_length_check(context: str, run: str) -> float:
    """A hidden check that varies across the tiny model's random answers."""
    return (len(oracle.last_assistant_text(run)) % 7) / 6


def ruler_messages(*answers: str) -> list[dict]:
    question = [{"role": "user", "content": "What is 2 + 3?"}]
    prompt = build_judge_prompt(
        distinct_runs([[*question, {"role": "assistant", "content": a}] for a in answers])
    )
    return prompt.messages


def test_the_stock_openai_client_gets_schema_valid_scores_that_follow_the_check():
    def check(context: str, run: str) -> float:
        assert "What is 2 + 3?" in context  # the shared context reaches the check
        return 1.0 if oracle.last_assistant_text(run) == "5" else 0.0

    with oracle.OracleJudge(check) as judge:
        client = openai.OpenAI(base_url=judge.base_url, api_key="oracle")
        assert [m.id for m in client.models.list()] == ["oracle-judge"]
        prompt = build_judge_prompt(
            distinct_runs(
                [
                    [
                        {"role": "user", "content": "What is 2 + 3?"},
                        {"role": "assistant", "content": a},
                    ]
                    for a in ["6", "5", "it is\n\nfive"]
                ]
            )
        )
        response = client.chat.completions.create(
            model="oracle-judge",
            messages=prompt.messages,  # type: ignore[arg-type]
            response_format={  # type: ignore[typeddict-item]
                "type": "json_schema",
                "json_schema": {"name": "ruler_scores", "schema": prompt.schema, "strict": True},
            },
        )
        scores, problems = validate_scores(json.loads(response.choices[0].message.content), 3)
        assert problems == [] and scores is not None
        assert [s.score for s in scores] == [0.0, 1.0, 0.0]
        assert response.usage is not None and response.usage.prompt_tokens > 0

        # What it cannot answer is a 400 that says what it wants; an unknown route a 404.
        with pytest.raises(openai.BadRequestError, match="RULER prompts only"):
            client.chat.completions.create(
                model="oracle-judge", messages=[{"role": "user", "content": "hi"}]
            )
        wrong_schema = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"required": ["run_1"]}},
        }
        with pytest.raises(openai.BadRequestError, match="schema asks for"):
            client.chat.completions.create(
                model="oracle-judge",
                messages=prompt.messages,  # type: ignore[arg-type]
                response_format=wrong_schema,  # type: ignore[arg-type]
            )
        assert httpx.post(f"{judge.base_url}/completions", json={}).status_code == 404


def test_noise_ties_and_inversion_do_what_they_say():
    messages = ruler_messages("1", "22", "333", "4444")
    prompt = messages[-1]["content"]

    def by_length(context: str, run: str) -> float:
        return len(oracle.last_assistant_text(run)) / 4

    def scores(judge) -> list[int]:
        answer = judge.judge(prompt)
        return [answer[f"run_{k}"]["score"] for k in range(1, 5)]

    assert scores(oracle.OracleJudge(by_length)) == [25, 50, 75, 100]
    assert scores(oracle.OracleJudge(by_length, invert=True)) == [75, 50, 25, 0]
    assert len(set(scores(oracle.OracleJudge(by_length, tie_rate=1.0)))) == 1
    noisy = oracle.OracleJudge(by_length, noise=0.5, seed=1)
    for _ in range(200):
        noisy.judge(prompt)
    assert 0.4 < noisy.stats.noisy_runs / noisy.stats.runs < 0.6
    sometimes_tied = oracle.OracleJudge(by_length, tie_rate=0.25, seed=1)
    for _ in range(200):
        sometimes_tied.judge(prompt)
    assert 0.15 < sometimes_tied.stats.tied_groups / sometimes_tied.stats.groups < 0.35
    with pytest.raises(ValueError, match="noise is a probability"):
        oracle.OracleJudge(by_length, noise=1.5)


@pytest.mark.parametrize("invert", [False, True], ids=["oracle", "inverted-oracle"])
async def test_the_judges_ranking_sets_the_sign_of_each_trained_advantage(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, invert: bool
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    groups = await groups_for(model, QUESTIONS, per_group=4)
    with oracle.OracleJudge(answer_length_check, invert=invert) as judge:
        judged = [
            await art.ruler_score_group(group, judge.model(), cache=False) for group in groups
        ]
    result = await model.train([g for g in judged if g is not None])

    ordered = 0
    for group in judged:
        assert group is not None
        runs = [
            (answer_length_check("", "assistant: " + (t.messages()[-1].get("content") or "")), t)
            for t in group
        ]
        for truth_a, a in runs:
            for truth_b, b in runs:
                if truth_a > truth_b:
                    ordered += 1
                    # The judge's score, the reward and the trained advantage all follow the
                    # hidden check (or all go against it when the oracle is inverted).
                    reward_gap = a.reward - b.reward
                    advantage_gap = result.advantages[a.id] - result.advantages[b.id]
                    assert (reward_gap < 0) if invert else (reward_gap > 0)
                    assert (advantage_gap < 0) if invert else (advantage_gap > 0)
    assert ordered > 0, "the tiny model's answers never differed on the check: nothing tested"
    assert result.metrics["groups/trainable"] > 0


async def test_the_example_trains_with_the_oracle_on_the_tiny_model(
    remote_backend: art.RemoteBackend,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    example = load_example("ruler_oracle_demo")
    # The hidden check of the example reads RULER's rendering of a demo question and answer.
    context = "system: Reply with the sum...\n\nuser: What is 3 + 4?"
    assert example.sum_check(context, "assistant: 3 + 4 = 7") == 1.0
    assert example.sum_check(context, "assistant: it is 7\n\nok") == 0.5
    assert example.sum_check(context, "assistant: 8") == 0.0

    train, held_out = example.split(6, 2, seed=0)
    model = await fresh_model(remote_backend, tiny_model_dir)
    # The tiny model never writes a sum, so the sum check would tie every group and train
    # nothing: the length check gives the judge something to rank.
    with oracle.OracleJudge(answer_length_check, seed=0) as judge:
        run = await example.train_with_oracle(
            model, judge, train, held_out, steps=1, groups_per_step=2, rollouts_per_group=3
        )
    assert model.step == 1 and [row["step"] for row in run.steps] == [1]
    assert run.judged_groups == 2 and run.before.step == 0 and run.after.step == 1
    assert set(run.after.metrics) == {"reward", "exact", "format", "contains_answer"}
