"""RULER: the judge prompt, the answer's validation and one re-ask, retries, cache and cost.

Exact cases run against a scripted OpenAI-compatible judge over real HTTP with the real openai
client; the tiny model served by our backend judges for real under constrained decoding.
"""

from __future__ import annotations

import functools
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_core.rewards import TrainingRun, group_scorer
from art_core.rewards._ruler_prompt import build_judge_prompt, distinct_runs
from art_core.utils import scenario_hash
from tests.support.rollouts import answer_rollout
from tests.support.scripted_judge import Reply, ScriptedJudge, scores_json

SYSTEM = {"role": "system", "content": "You are a travel agent. " + "Policy text. " * 40}
USER = {"role": "user", "content": "Book me a flight to Lisbon on Friday."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Find flights to a city on a date.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def run(answer: str, *, tool_output: str | None = None) -> list[dict]:
    """A conversation: shared system + user, then (optionally) a tool call and its result."""
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    if tool_output is not None:
        call_id = f"call_{abs(hash(answer)) % 10_000}"
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "search_flights", "arguments": '{"city": "Lisbon"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": tool_output},
        ]
    return [*messages, {"role": "assistant", "content": answer}]


def group_of(*answers: str, rewards: list[float] | None = None) -> art.TrajectoryGroup:
    rewards = rewards or [0.0] * len(answers)
    return art.TrajectoryGroup(
        art.Trajectory(messages_and_choices=run(a), tools=TOOLS, reward=r, metrics={"m": 1})
        for a, r in zip(answers, rewards, strict=True)
    )


# ------------------------------------------------------------------------------------ the prompt


def test_shared_messages_and_tools_are_sent_once_and_each_run_is_tagged():
    lists = [run("Booked TP123."), run("I cannot help."), run("Booked TP999.")]
    prompt = build_judge_prompt(distinct_runs(lists, TOOLS))
    user = prompt.messages[-1]["content"]
    assert user.count("Policy text.") == 40 and user.count("Book me a flight") == 1
    assert user.count("search_flights") == 1
    assert [f'<run id="{k}">' in user for k in (1, 2, 3)] == [True] * 3
    assert '"run_1", "run_2", "run_3"' in user and "Score exactly 3 runs" in user
    assert prompt.schema["required"] == ["run_1", "run_2", "run_3"]
    assert prompt.schema["additionalProperties"] is False


def test_identical_runs_are_judged_once():
    distinct = distinct_runs([run("same"), run("other"), run("same")])
    assert len(distinct.runs) == 2 and distinct.index_of == [0, 1, 0]


def test_long_messages_are_shortened_with_a_visible_marker_and_counted():
    huge = "x" * 10_000
    lists = [run("a", tool_output=huge), run("b", tool_output="short")]
    prompt = build_judge_prompt(distinct_runs(lists), message_char_budget=1000)
    user = prompt.messages[-1]["content"]
    assert "characters cut ...]" in user and len(user) < 6000
    assert prompt.truncated_messages == 1 and prompt.truncated_chars > 8000
    assert "tool result (search_flights)" in user  # tool results named after their call


def test_a_single_run_keeps_its_task_as_context():
    prompt = build_judge_prompt(distinct_runs([run("Booked.")]))
    user = prompt.messages[-1]["content"]
    assert "<context>" in user and '<run id="1">\nassistant: Booked.' in user
    assert "Score exactly 1 run," in user


# ------------------------------------------------------------------------- scores and re-asks


async def test_scores_become_rewards_and_the_old_reward_is_kept(
    scripted_judge: ScriptedJudge, judge_model: art.Model, tmp_path: Path
):
    scripted_judge.queue(scores_json(0.9, 0.1, 0.5, explanation="because"))
    group = group_of("Booked TP123.", "No.", "Maybe.", rewards=[1.0, 0.0, 0.5])
    scored = await art.ruler_score_group(group, judge=judge_model, cache=tmp_path)
    assert scored is not None and scored is not group
    assert scored.rewards == [0.9, 0.1, 0.5]
    first = scored.trajectories[0]
    assert first.metrics == {"m": 1, "independent_reward": 1.0, "ruler_score": 0.9}
    assert first.logs[-1] == "RULER: because"
    assert group.rewards == [1.0, 0.0, 0.5]  # the input group is not modified
    request = scripted_judge.requests[0]
    assert request["temperature"] == 0.0  # a judge scores greedily unless told otherwise
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["schema"]["required"] == [
        "run_1",
        "run_2",
        "run_3",
    ]
    # usage (100 prompt + 20 completion tokens scripted) at $1/$4 per million
    assert scored.metrics["judge/requests"] == 1
    assert scored.metrics["judge/prompt_tokens"] == 100
    assert scored.metrics["judge/completion_tokens"] == 20
    assert scored.metrics["judge/cost_usd"] == pytest.approx((100 * 1 + 20 * 4) / 1e6)


@pytest.mark.parametrize(
    ("bad_answer", "named_problem"),
    [
        (scores_json(0.9, 0.1), '"run_3" is missing'),
        (
            '{"run_1": {"explanation": "a", "score": 1}, "run_1": {"explanation": "b", '
            '"score": 0}, "run_2": {"explanation": "c", "score": 0}, '
            '"run_3": {"explanation": "d", "score": 0}}',
            'the key "run_1" appears more than once',
        ),
        ('{"run_1": {"score": 0.3', "it is not valid JSON"),
        (scores_json(0.9, 1.5, 0.2), '"run_2" has score 150.0, outside 0 to 100'),
        (scores_json(0.9, 0.1, 0.2, 0.4), '"run_4" is not one of the runs (the ids are 1 to 3)'),
        ('{"run_1": {"score": "high"}, "run_2": 0.1, "run_3": 0.2}', '"run_1" has no numeric'),
    ],
    ids=["short", "duplicate", "malformed", "out-of-range", "extra-id", "not-a-number"],
)
async def test_a_bad_answer_gets_one_reask_saying_what_was_wrong(
    scripted_judge: ScriptedJudge, judge_model: art.Model, bad_answer: str, named_problem: str
):
    scripted_judge.queue(bad_answer, scores_json(0.2, 0.4, 0.6))
    usage = art.JudgeUsage()
    scores = await art.ruler([run("a"), run("b"), run("c")], judge_model, cache=False, usage=usage)
    assert [s.score for s in scores] == [0.2, 0.4, 0.6]
    reask = scripted_judge.requests[1]["messages"]
    assert reask[-2] == {"role": "assistant", "content": bad_answer}
    assert named_problem in reask[-1]["content"]
    assert usage.requests == 2 and usage.reasks == 1


async def test_two_bad_answers_raise_a_named_error_or_drop_the_group(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = Reply(scores_json(0.5))
    with pytest.raises(art.JudgeResponseError, match='"run_2" is missing') as caught:
        await art.ruler([run("a"), run("b")], judge_model, cache=False)
    assert caught.value.problems == ['"run_2" is missing']
    assert len(scripted_judge.requests) == 2
    dropped = await art.ruler_score_group(
        group_of("a", "b"), judge_model, swallow_exceptions=True, cache=False
    )
    assert dropped is None


async def test_an_answer_cut_at_the_token_limit_is_named(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = Reply('{"run_1": {"explanation": "lo', finish_reason="length")
    with pytest.raises(art.JudgeResponseError, match="cut off at the 50-token limit"):
        await art.ruler([run("a"), run("b")], judge_model, cache=False, max_tokens=50)


async def test_all_identical_trajectories_are_judged_once_with_one_run(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.queue(scores_json(0.7))
    scored = await art.ruler_score_group(group_of("same", "same", "same"), judge_model, cache=False)
    assert scored is not None and scored.rewards == [0.7, 0.7, 0.7]
    assert len(scripted_judge.requests) == 1
    assert "Score exactly 1 run," in scripted_judge.user_prompt()


# --------------------------------------------------------------------- retries and transport


async def test_a_500_then_success_is_retried(scripted_judge: ScriptedJudge, judge_model: art.Model):
    scripted_judge.queue(Reply(status=500), scores_json(1.0, 0.0))
    scores = await art.ruler([run("a"), run("b")], judge_model, cache=False)
    assert [s.score for s in scores] == [1.0, 0.0]
    assert len(scripted_judge.requests) == 2


async def test_a_timeout_is_retried(scripted_judge: ScriptedJudge, judge_model: art.Model):
    scripted_judge.queue(Reply(scores_json(0.0, 0.0), delay=3.0), scores_json(0.3, 0.6))
    scores = await art.ruler([run("a"), run("b")], judge_model, cache=False, timeout=0.5)
    assert [s.score for s in scores] == [0.3, 0.6]


async def test_a_judge_that_keeps_failing_is_unavailable(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = Reply(status=503)
    with pytest.raises(art.JudgeUnavailableError, match=r"kept failing \(503\) after 2 attempts"):
        await art.ruler([run("a"), run("b")], judge_model, cache=False, max_retries=1)


async def test_a_refused_request_says_why(scripted_judge: ScriptedJudge, judge_model: art.Model):
    scripted_judge.queue(Reply(status=400))
    with pytest.raises(art.JudgeError, match=r"refused the request \(400\):.*scripted 400"):
        await art.ruler([run("a"), run("b")], judge_model, cache=False)


async def test_an_unreachable_judge_is_unavailable():
    nowhere = art.Model(name="judge", base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(art.JudgeUnavailableError, match="did not answer after 1 attempts"):
        await art.ruler([run("a"), run("b")], nowhere, cache=False, max_retries=0)


async def test_a_prompt_too_long_for_the_judge_is_cut_harder_and_resent(
    scripted_judge: ScriptedJudge, judge_model: art.Model, tmp_path: Path
):
    too_long = "This model's maximum context length is 8192 tokens. However, you requested 9000."
    scripted_judge.queue(Reply(status=400, message=too_long), scores_json(0.5, 0.5))
    usage = art.JudgeUsage()
    lists = [run("a", tool_output="x" * 5000), run("b", tool_output="y" * 5000)]
    await art.ruler(lists, judge_model, cache=False, usage=usage)
    first, second = (len(scripted_judge.user_prompt(i)) for i in (0, 1))
    assert second < first - 1500  # each 5000-char result cut to 1000 instead of 2000
    assert usage.truncated_messages == 2
    # with a cache, a re-run knows the first prompt is too long: no request at all
    scripted_judge.reset()
    scripted_judge.queue(Reply(status=400, message=too_long), scores_json(0.5, 0.5))
    await art.ruler(lists, judge_model, cache=tmp_path)
    again = art.JudgeUsage()
    await art.ruler(lists, judge_model, cache=tmp_path, usage=again)
    assert len(scripted_judge.requests) == 2 and again.cache_hits == 1 and again.requests == 0


# ----------------------------------------------------------------------------- cache and cost


async def test_the_cache_makes_a_repeated_judgement_free(
    scripted_judge: ScriptedJudge, judge_model: art.Model, tmp_path: Path
):
    scripted_judge.queue(scores_json(0.8, 0.2))
    first_usage, second_usage = art.JudgeUsage(), art.JudgeUsage()
    lists = [run("a"), run("b")]
    first = await art.ruler(lists, judge_model, cache=tmp_path, usage=first_usage)
    second = await art.ruler(lists, judge_model, cache=tmp_path, usage=second_usage)
    assert first == second and len(scripted_judge.requests) == 1
    assert second_usage.requests == 0 and second_usage.cache_hits == 1
    assert second_usage.cost_usd == 0 and first_usage.cost_usd > 0
    # another rubric is another question: a miss
    scripted_judge.queue(scores_json(0.1, 0.9))
    other = await art.ruler(lists, judge_model, rubric="Prefer brevity.", cache=tmp_path)
    assert [s.score for s in other] == [0.1, 0.9] and len(scripted_judge.requests) == 2


async def test_a_corrupt_cache_entry_is_a_miss(
    scripted_judge: ScriptedJudge, judge_model: art.Model, tmp_path: Path
):
    scripted_judge.default = Reply(scores_json(0.4, 0.6))
    await art.ruler([run("a"), run("b")], judge_model, cache=tmp_path)
    for entry in tmp_path.rglob("*.json"):
        entry.write_text("{torn")
    scores = await art.ruler([run("a"), run("b")], judge_model, cache=tmp_path)
    assert [s.score for s in scores] == [0.4, 0.6] and len(scripted_judge.requests) == 2


async def test_reverse_order_check_averages_both_orders_and_reports_the_gap(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    # forward: runs a, b, c; reversed: c, b, a (so run_1 is c)
    scripted_judge.queue(scores_json(0.9, 0.5, 0.1), scores_json(0.3, 0.5, 0.7))
    usage = art.JudgeUsage()
    scores = await art.ruler(
        [run("a"), run("b"), run("c")],
        judge_model,
        reverse_order_check=True,
        cache=False,
        usage=usage,
    )
    assert [s.score for s in scores] == pytest.approx([0.8, 0.5, 0.2])
    assert [s.position_gap for s in scores] == pytest.approx([0.2, 0.0, 0.2])
    assert usage.requests == 2  # the cost of the check: a second judgement
    second = scripted_judge.user_prompt(1)
    assert second.index("assistant: c") < second.index("assistant: a")


# ----------------------------------------------------------------------------- naming a judge


async def test_a_judge_named_by_string_reads_the_environment(
    scripted_judge: ScriptedJudge, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", scripted_judge.url)
    scripted_judge.queue(scores_json(0.25, 0.75))
    scores = await art.ruler([run("a"), run("b")], "openai/gpt-4.1-mini", cache=False)
    assert [s.score for s in scores] == [0.25, 0.75]
    assert scripted_judge.requests[0]["model"] == "gpt-4.1-mini"


def test_a_judge_string_without_its_key_or_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(art.ModelConfigError, match="set OPENAI_API_KEY"):
        art.resolve_model("openai/gpt-4.1-mini")
    with pytest.raises(art.ModelConfigError, match="set ACME_BASE_URL"):
        art.resolve_model("acme/judge-1")
    with pytest.raises(art.ModelConfigError, match="'<provider>/<model>'"):
        art.resolve_model("my-judge-1")
    # A bare name of OpenAI's or Anthropic's families is placed as LiteLLM places it.
    with pytest.raises(art.ModelConfigError, match="'openai/gpt-4o-mini' needs an API key"):
        art.resolve_model("gpt-4o-mini")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    claude = art.resolve_model("claude-sonnet-4-5")
    assert (claude.name, claude.base_url) == ("claude-sonnet-4-5", "https://api.anthropic.com/v1/")


# ---------------------------------------------------------------- in a gather, and in training


async def test_as_after_each_a_failed_judgement_drops_the_group_and_the_step_counts_it(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    remote_backend: art.RemoteBackend,
    tiny_model_dir: Path,
):
    model = art.TrainableModel(
        name=f"ruler-{uuid.uuid4().hex[:6]}", project="tests", base_model=str(tiny_model_dir)
    )
    await model.register(remote_backend)
    scripted_judge.queue(
        scores_json(1.0, 0.0, 0.5), "not json", "still not json"
    )  # group 1 scored; group 2's judge fails twice
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(answer_rollout(model, f"q{g}") for _ in range(3)) for g in range(2)],
        after_each=functools.partial(
            art.ruler_score_group, judge=judge_model, swallow_exceptions=True, cache=False
        ),
        show_progress=False,
    )
    assert len(groups) == 1 and groups.dropped == 1
    result = await model.train(groups, learning_rate=1e-4)
    assert result.metrics["groups/dropped_before_training"] == 1
    assert result.metrics["judge/requests"] == 1 and result.metrics["judge/prompt_tokens"] == 100


def distinct_scores(request: dict) -> Reply:
    """A judgement of however many runs the prompt shows, each scored differently."""
    count = len(request["response_format"]["json_schema"]["schema"]["required"])
    return Reply(scores_json(*(k / count for k in range(count))))


async def test_a_scored_trajectory_names_its_judge_call_and_the_step_manifest_records_it(
    scripted_judge: ScriptedJudge, judge_model: art.Model, tmp_path: Path
):
    scripted_judge.default = distinct_scores
    scored = await art.ruler_score_group(group_of("a", "b"), judge_model, cache=tmp_path)
    assert scored is not None
    [key] = {t.metadata["judge_cache_key"] for t in scored.trajectories}
    # The very key of that call's cache entry (not a second hash of something else).
    assert [entry.stem for entry in tmp_path.rglob("*.json")] == [key]
    again = await art.ruler_score_group(group_of("a", "b"), judge_model, cache=tmp_path)
    assert again is not None and again.trajectories[0].metadata["judge_cache_key"] == key
    assert len(scripted_judge.requests) == 1  # the second was a hit, under the same key
    # With the reverse-order check, both calls are named, in the order they were made.
    checked = await art.ruler_score_group(
        group_of("a", "b"), judge_model, cache=tmp_path, reverse_order_check=True
    )
    assert checked is not None
    keys = checked.trajectories[0].metadata["judge_cache_key"]
    assert isinstance(keys, list) and len(keys) == 2 and keys[0] == key
    assert {entry.stem for entry in tmp_path.rglob("*.json")} == set(keys)


async def test_a_training_run_sends_scenario_hashes_and_judge_keys_to_the_replay_manifest(
    scripted_judge: ScriptedJudge,
    judge_model: art.Model,
    remote_backend: art.RemoteBackend,
    tiny_model_dir: Path,
    tmp_path: Path,
):
    scripted_judge.default = distinct_scores
    model = art.TrainableModel(
        name=f"ruler-{uuid.uuid4().hex[:6]}", project="tests", base_model=str(tiny_model_dir)
    )
    await model.register(remote_backend)
    scenario = art.Scenario(task="What is 2 + 2?", difficulty=1)

    async def rollout(scenario: art.Scenario, temperature: float) -> art.Trajectory:
        return await answer_rollout(model, scenario.task)

    run = TrainingRun(
        model,
        rollout,
        score_group=group_scorer([scenario], judge=judge_model, cache=tmp_path),
        score_answer=lambda scenario, trajectory: None,  # type: ignore[arg-type,return-value]
        show_progress=False,
    )
    [result] = await run.train(
        [scenario], steps=1, groups_per_step=1, rollouts_per_group=4,
        config=art.TrainConfig(learning_rate=1e-4),
    )  # fmt: skip
    [key] = [entry.stem for entry in tmp_path.rglob("*.json")]
    assert result.checkpoint_path is not None
    record = json.loads((Path(result.checkpoint_path) / "replay.json").read_text())
    assert record["client"]["judge_cache_key"] == [key]
    assert record["client"]["scenario_sha256"] == [scenario_hash(scenario)]


# ------------------------------------------------------------------- our backend as the judge


async def test_the_tiny_model_on_our_backend_judges_under_constrained_decoding(
    remote_backend: art.RemoteBackend,
):
    judge = art.Model(name="tiny")
    await judge.register(remote_backend)
    usage = art.JudgeUsage()
    lists = [run("Booked TP123."), run("I cannot help."), run("Booked.", tool_output="TP1 09:00")]
    scores = await art.ruler(lists, judge, "Prefer bookings.", TOOLS, cache=False, usage=usage)
    assert len(scores) == 3 and all(0 <= s.score <= 1 for s in scores)
    assert usage.requests == 1 and usage.reasks == 0  # the schema made the first answer valid
    assert usage.prompt_tokens > 100


async def test_the_trained_model_itself_can_judge(model: art.TrainableModel):
    scored = await art.ruler_score_group(group_of("yes", "no"), model, cache=False)
    assert scored is not None and all(0 <= r <= 1 for r in scored.rewards)
    assert json.dumps(scored.metrics)  # plain numbers
