"""RULER called as ART 0.5.23 calls it: `ruler(message_lists, judge_model, extra_litellm_params,
rubric, tools, *, debug)` and `ruler_score_group(group, judge_model, extra_litellm_params, rubric,
*, swallow_exceptions, debug)`, beside our own order.

The judge is a real art-server on 127.0.0.1 serving the tiny model as `o3`, with an API key:
ART's default judge `"openai/o3"` reaches it through OPENAI_BASE_URL / OPENAI_API_KEY, or
`hosted_vllm/o3` through `extra_litellm_params={"api_base": ..., "api_key": ...}`. Exactly what
reaches the wire (LiteLLM's names mapped onto the request) is read off the scripted judge, which
records every request. ART's documented calls (docs/fundamentals/ruler.mdx) run as written there,
with `import art` changed to `import art_core as art`.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_core.errors import IgnoredSettingWarning
from tests.support.scripted_judge import Reply, ScriptedJudge, scores_json
from tests.support.servers import RunningServer, running_server

KEY = "judge-key"
SYSTEM = {"role": "system", "content": "You are a comedy writer. Tell one short joke."}
USER = {"role": "user", "content": "A joke about computers, please."}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def run(answer: str) -> list[dict[str, Any]]:
    return [SYSTEM, USER, {"role": "assistant", "content": answer}]


def group_of(*answers: str) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        art.Trajectory(messages_and_choices=run(a), reward=0.5) for a in answers
    )


def in_order(request: dict[str, Any]) -> Reply:
    """Scores rising with the run's place, for however many runs the prompt shows."""
    count = len(request["response_format"]["json_schema"]["schema"]["required"])
    return Reply(scores_json(*(k / count for k in range(1, count + 1)), explanation="ranked"))


@pytest.fixture(scope="module")
def o3_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> Iterator[RunningServer]:
    """The tiny model served as `o3`, behind an API key: a local stand-in for ART's judge."""
    path = tmp_path_factory.mktemp("art-o3")
    with running_server(tiny_model_dir, path, name="o3", api_key=KEY, **engine_options) as running:
        yield running


@pytest.fixture
def openai_is_the_local_server(o3_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`"openai/o3"` (ART's default judge) answered by the local server."""
    monkeypatch.setenv("OPENAI_BASE_URL", f"{o3_server.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.fixture
def openai_is_the_scripted_judge(
    scripted_judge: ScriptedJudge, monkeypatch: pytest.MonkeyPatch
) -> ScriptedJudge:
    monkeypatch.setenv("OPENAI_BASE_URL", scripted_judge.url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    scripted_judge.default = in_order
    return scripted_judge


# -------------------------------------------------------------- the calls ART's docs write


async def test_arts_positional_judge_with_debug_prints_each_trajectorys_score(
    openai_is_the_local_server: None, capsys: pytest.CaptureFixture[str]
):
    judged = await art.ruler_score_group(group_of("Crash!", "Broken."), "openai/o3", debug=True)
    assert judged is not None and all(0 <= r <= 1 for r in judged.rewards)
    printed = capsys.readouterr().out
    assert "[RULER] Pretty-printed LLM choice JSON:" in printed
    assert "'trajectory_id': '1'" in printed and "'trajectory_id': '2'" in printed
    assert printed.count("'explanation':") == 2


async def test_judge_model_by_keyword_or_left_out_is_arts_default_judge(
    openai_is_the_local_server: None,
):
    by_keyword = await art.ruler_score_group(group_of("a", "b"), judge_model="openai/o3")
    by_default = await art.ruler_score_group(group_of("a", "b"))
    assert by_keyword is not None and by_default is not None
    assert len(by_keyword.rewards) == len(by_default.rewards) == 2
    with pytest.raises(art.UnsupportedOptionError, match="judge_model and judge are one"):
        await art.ruler_score_group(group_of("a"), judge_model="openai/o3", judge="openai/o3")


async def test_extra_litellm_params_reach_the_judges_request(
    openai_is_the_scripted_judge: ScriptedJudge,
):
    judged = await art.ruler_score_group(
        group_of("a", "b"),
        "openai/o3",
        extra_litellm_params={"temperature": 0.7, "max_tokens": 1000},
        cache=False,
    )
    assert judged is not None and judged.rewards == [0.5, 1.0]
    [request] = openai_is_the_scripted_judge.requests
    assert request["model"] == "o3"
    assert request["temperature"] == 0.7 and request["max_completion_tokens"] == 1000


async def test_ruler_numbers_the_trajectories_in_input_order(openai_is_the_local_server: None):
    scores = await art.ruler([run("Crash!"), run("Broken."), run("Crash!")], "openai/o3")
    assert [s.trajectory_id for s in scores] == ["1", "2", "3"]
    assert scores[0].score == scores[2].score  # identical runs are judged once
    assert all(isinstance(s.explanation, str) for s in scores)


# ----------------------------------------------------------------- LiteLLM's names, mapped


async def test_a_hosted_vllm_judge_is_reached_at_its_api_base_with_its_api_key(
    o3_server: RunningServer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("HOSTED_VLLM_BASE_URL", raising=False)
    monkeypatch.delenv("HOSTED_VLLM_API_BASE", raising=False)
    endpoint = {"api_base": f"{o3_server.url}/v1", "api_key": KEY}
    scores = await art.ruler([run("a"), run("b")], "hosted_vllm/o3", endpoint, cache=False)
    assert [s.trajectory_id for s in scores] == ["1", "2"]
    with pytest.raises(art.JudgeError, match="rejected the API key"):
        await art.ruler(
            [run("a"), run("b")], "hosted_vllm/o3", {**endpoint, "api_key": "wrong"}, cache=False
        )
    with pytest.raises(art.ModelConfigError, match="api_base"):
        await art.ruler([run("a")], "hosted_vllm/o3")
    assert art.resolve_model("ollama/qwen3:32b").base_url == "http://localhost:11434/v1"


async def test_a_parameter_that_cannot_be_honoured_is_named_in_a_warning(
    openai_is_the_scripted_judge: ScriptedJudge,
):
    params = {"frobnicate": 1, "caching": True, "seed": 3, "top_k": 5, "num_retries": 0}
    with pytest.warns(IgnoredSettingWarning) as caught:
        await art.ruler([run("a"), run("b")], "openai/gpt-4.1-mini", params, cache=False)
    [warning] = caught
    said = str(warning.message)
    assert "frobnicate (not a setting of this judge client)" in said
    assert "caching (RULER caches answers on disk itself (cache=))" in said
    assert "seed" not in said and "top_k" not in said and "num_retries" not in said
    assert warning.filename == __file__  # it points at the caller's line
    [request] = openai_is_the_scripted_judge.requests
    assert request["seed"] == 3 and request["top_k"] == 5 and request["temperature"] == 0.0


async def test_one_setting_given_both_ways_with_two_values_is_an_error(
    openai_is_the_scripted_judge: ScriptedJudge,
):
    with pytest.raises(art.UnsupportedOptionError, match="max_tokens is given twice"):
        await art.ruler([run("a")], "openai/gpt-4.1-mini", {"max_tokens": 100}, max_tokens=50)
    with pytest.raises(art.UnsupportedOptionError, match="temperature is given twice"):
        await art.ruler_score_group(
            group_of("a"), "openai/o3", {"temperature": 1.0}, sampling={"temperature": 0.0}
        )
    assert openai_is_the_scripted_judge.requests == []


async def test_openais_reasoning_models_are_sent_no_temperature(
    openai_is_the_scripted_judge: ScriptedJudge,
):
    # o3 and o4-mini refuse any temperature but 1: greedy judging cannot be asked of them.
    await art.ruler([run("a"), run("b")], "openai/o4-mini", cache=False)
    await art.ruler([run("a"), run("b")], "openai/gpt-4.1-mini", cache=False)
    reasoning, chat = openai_is_the_scripted_judge.requests
    assert reasoning["model"] == "o4-mini" and "temperature" not in reasoning
    assert chat["temperature"] == 0.0


# --------------------------------------------------------------------- our order, still read


async def test_a_str_third_is_our_rubric_and_a_dict_third_arts_settings(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = in_order
    lists = [run("a"), run("b")]
    await art.ruler(lists, judge_model, "Prefer puns.", TOOLS, cache=False)
    await art.ruler(lists, judge_model, None, "Prefer puns.", TOOLS, cache=False)
    await art.ruler_score_group(group_of("a", "b"), judge_model, "Prefer puns.", cache=False)
    ours, arts, group = (scripted_judge.requests[k]["messages"] for k in range(3))
    assert ours == arts and "Prefer puns." in str(ours) and "lookup" in str(ours)
    assert "Prefer puns." in str(group)
    with pytest.raises(art.UnsupportedOptionError, match="rubric or tools is given twice"):
        await art.ruler(lists, judge_model, "Prefer puns.", rubric="Prefer rhymes.")
    with pytest.raises(art.UnsupportedOptionError, match="tools come after it"):
        await art.ruler(lists, judge_model, None, TOOLS)


# ------------------------------------------------------------ ART's ruler.mdx, as written


# "Complete Example: Joke Generation", `import art` as `import art_core as art`.
ART_JOKE_EXAMPLE = """
import asyncio
import art_core as art
from art_core.rewards import ruler_score_group
from openai.types.chat.chat_completion import Choice
from openai.types.chat import ChatCompletionMessage

async def main():
    # Initial messages shared by all trajectories
    initial_messages = [
        {"role": "system", "content": "You are a comedy writer. Generate funny jokes based on the given topic."},
        {"role": "user", "content": "Tell me a funny joke about computers"}
    ]

    # Create three trajectories with different quality responses
    good_trajectory = art.Trajectory(
        messages_and_choices=[
            *initial_messages,
            Choice(finish_reason="stop", index=0, message=ChatCompletionMessage(
                role="assistant",
                content="Why don't computers ever get invited to parties?\\n\\nBecause they always crash! 🥁\\n\\nBut seriously, have you tried turning them off and on again?"
            ))
        ],
        reward=0.0
    )

    mediocre_trajectory = art.Trajectory(
        messages_and_choices=[
            *initial_messages,
            Choice(finish_reason="stop", index=0, message=ChatCompletionMessage(
                role="assistant",
                content="What do you call a computer that doesn't work?\\n\\nBroken."
            ))
        ],
        reward=0.0
    )

    off_topic_trajectory = art.Trajectory(
        messages_and_choices=[
            *initial_messages,
            Choice(finish_reason="stop", index=0, message=ChatCompletionMessage(
                role="assistant",
                content="I don't really know jokes about computers, but here's a fact: The sky is blue because of Rayleigh scattering."
            ))
        ],
        reward=0.0
    )

    # Create a TrajectoryGroup and use RULER to score
    group = art.TrajectoryGroup([good_trajectory, mediocre_trajectory, off_topic_trajectory])
    judged_group = await ruler_score_group(group, "openai/o3", debug=True)

    # Display rankings
    if judged_group:
        sorted_trajectories = sorted(judged_group.trajectories, key=lambda t: t.reward, reverse=True)
        for rank, traj in enumerate(sorted_trajectories, 1):
            messages = traj.messages()
            print(f"Rank {rank}: Score {traj.reward:.3f}")
            print(f"  Response: {messages[-1]['content'][:50]}...")

asyncio.run(main())
"""

# "Extra LiteLLM Parameters", "Custom Rubric" and "Using Raw Message Lists": top-level await,
# with `group` given (the docs' own context).
ART_EXTRA_LITELLM_PARAMS = """
# Adjust temperature and max tokens
await ruler_score_group(
    group,
    "openai/o3",
    extra_litellm_params={"temperature": 0.7, "max_tokens": 1000}
)

# Use custom API base for local models
await ruler_score_group(
    group,
    "openai/gpt-4",
    extra_litellm_params={"api_base": "http://localhost:8000"}
)
"""

ART_CUSTOM_RUBRIC = '''
custom_rubric = """
- Prioritize responses that are concise and clear
- Penalize responses that include emojis or informal language
- Reward responses that cite sources
"""

await ruler_score_group(
    group,
    "openai/o3",
    rubric=custom_rubric
)
'''

ART_RAW_MESSAGE_LISTS = """
from art_core.rewards import ruler

# Each message list is a list of ChatCompletionMessageParam dicts
message_lists = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 equals 4."}
    ],
    # ... more trajectories
]

scores = await ruler(
    message_lists,
    "openai/o3"
)

for score in scores:
    print(f"Trajectory {score.trajectory_id}: {score.score} - {score.explanation}")
"""


async def run_block(code: str, namespace: dict[str, Any]) -> None:
    """A docs block with top-level `await`, run in `namespace`."""
    compiled = compile(code, "ruler.mdx", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)
    if inspect.iscoroutine(result):
        await result


async def test_arts_joke_example_runs_as_written(
    openai_is_the_local_server: None, capsys: pytest.CaptureFixture[str]
):
    # Its own asyncio.run: in a thread of its own, as in a program of its own.
    await asyncio.to_thread(exec, compile(ART_JOKE_EXAMPLE, "ruler.mdx", "exec"), {})
    printed = capsys.readouterr().out
    assert "[RULER] Pretty-printed LLM choice JSON:" in printed
    assert [f"Rank {k}: Score" in printed for k in (1, 2, 3)] == [True] * 3


async def test_arts_other_documented_calls_run_as_written(
    openai_is_the_local_server: None,
    scripted_judge: ScriptedJudge,
    capsys: pytest.CaptureFixture[str],
):
    scripted_judge.default = in_order  # the "custom API base" of the second call
    namespace = {"group": group_of("a", "b"), "ruler_score_group": art.ruler_score_group}
    local_api_base = ART_EXTRA_LITELLM_PARAMS.replace("http://localhost:8000", scripted_judge.url)
    for block in (local_api_base, ART_CUSTOM_RUBRIC, ART_RAW_MESSAGE_LISTS):
        await run_block(block, namespace)
    [request] = scripted_judge.requests
    assert request["model"] == "gpt-4"
    assert "Trajectory 1: " in capsys.readouterr().out
