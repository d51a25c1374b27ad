"""The behaviour diff between two steps: the comparison (pure), the page over HTTP, `art diff`.

The held-out answers are logged through the real server (`model.log(groups, split="val")` at
step 0, one train step, again at step 1) and read back from its `.art` folder, as the review
app and `art diff` read them.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import art_core as art
from art_backend._errors import InvalidRequestError
from art_backend.review import diff_cli
from art_backend.review._diff import (
    CorrectnessRule,
    DiffOptions,
    answer_format,
    compare_rows,
    example_key,
    filter_examples,
)
from art_backend.store._checkpoints import ModelStore
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer

ROOT = Path(__file__).resolve().parents[3]

# ------------------------------------------------------------------------------ conversations


def said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def called(*names: str) -> dict[str, Any]:
    calls = [
        {"id": f"call-{n}", "type": "function", "function": {"name": n, "arguments": "{}"}}
        for n in names
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def returned(text: str, name: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call-{name}", "content": text}


def row(
    question: str,
    *answer: dict[str, Any],
    reward: float = 1.0,
    scenario_id: str | None = None,
    trajectory_id: str = "t",
    **metrics: float,
) -> dict[str, Any]:
    """A row as the server stores it (`trajectories/<split>/<step>.jsonl.gz`)."""
    return {
        "group": 0,
        "id": trajectory_id,
        "reward": reward,
        "metrics": metrics,
        "metadata": {"scenario_id": scenario_id} if scenario_id else {},
        "histories": [{"messages": [{"role": "user", "content": question}, *answer]}],
    }


def tags(before: dict[str, Any], after: dict[str, Any], **options: Any) -> list[str]:
    diff = compare_rows(
        [before], [after], split="val", from_step=0, to_step=1, options=DiffOptions(**options)
    )
    assert len(diff.examples) == 1
    return diff.examples[0].tags


# ------------------------------------------------------------------------- the comparison


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (row("2+2?", said("five"), reward=0), row("2+2?", said("4"), reward=1), ["newly_right"]),
        (row("2+2?", said("4"), reward=1), row("2+2?", said("5"), reward=0), ["newly_wrong"]),
        (row("q", said("12 bags")), row("q", said('{"bags": 12}')), ["format_changed"]),
        (row("q", said("12 bags")), row("q", said("```\n12\n```")), ["format_changed"]),
        (row("q", said("12 bags")), row("q", said("- 12 bags")), ["format_changed"]),
        (
            row("q", said("12 bags")),
            row("q", called("get_item")),
            ["format_changed", "tools_changed"],
        ),
        (row("q", said("Twelve.")), row("q", said("Twelve. " * 10)), ["length_changed"]),
        (
            row("q", called("get_item"), returned("3", "get_item"), said("3")),
            row("q", called("search", "get_item"), returned("3", "get_item"), said("3")),
            ["tools_changed"],
        ),
        (row("q", said("same"), reward=0.5), row("q", said("same"), reward=0.9), []),
        (
            row("2+2?", said("I am not sure at all, sorry."), reward=0),
            row("2+2?", called("calculator"), returned("4", "calculator"), said("4"), reward=1),
            ["newly_right", "length_changed", "tools_changed"],  # several tags apply
        ),
    ],
)
def test_each_change_is_tagged(before: dict, after: dict, expected: list[str]):
    assert tags(before, after) == expected


def test_length_changes_beyond_a_relative_margin_and_a_few_characters():
    short, long = row("q", said("x" * 100)), row("q", said("x" * 149))
    assert tags(short, long) == []  # 1.49x: within the default margin of 0.5
    assert tags(short, long, length_margin=0.25) == ["length_changed"]
    assert tags(row("q", said("abc")), row("q", said("abcdefghij"))) == []  # 3.3x, 7 characters
    assert tags(row("q", said("abc")), row("q", said("abcdefghij")), min_length_change=5) == [
        "length_changed"
    ]


def test_right_is_the_reward_above_a_threshold_or_a_named_metric():
    before = row("q", said("a"), reward=0.4, correct=0.0)
    after = row("q", said("a"), reward=0.6, correct=1.0)
    assert tags(before, after) == []  # both rewards > 0: right at both steps
    assert tags(before, after, rule=CorrectnessRule(threshold=0.5)) == ["newly_right"]
    assert tags(before, after, rule=CorrectnessRule(metric="correct")) == ["newly_right"]
    # A row without the metric is neither right nor wrong: no right/wrong tag, "not judged".
    missing = row("q", said("a"), reward=0.6)
    assert tags(before, missing, rule=CorrectnessRule(metric="correct")) == []
    assert CorrectnessRule(metric="correct").is_right(missing) is None
    assert CorrectnessRule(metric="correct", threshold=0.5).describe() == "correct > 0.5"


def test_examples_match_by_scenario_id_then_scenario_then_prompt():
    prompt_only = row("What is 2 + 2?", said("4"))
    assert example_key(prompt_only) == ("prompt", "user: What is 2 + 2?")
    assert example_key(row("asked differently", said("4"), scenario_id="sum-1")) == (
        "scenario_id",
        "sum-1",
    )
    scenario = {**prompt_only, "metadata": {"scenario": {"task": "sum", "n": 1}}}
    assert example_key(scenario) == ("scenario", '{"n": 1, "task": "sum"}')

    # The same scenario id matches across reworded prompts; the system prompt is part of a
    # prompt key, and the assistant's turns are not.
    diff = compare_rows(
        [row("What is 2+2?", said("5"), scenario_id="sum-1", reward=0)],
        [row("Compute 2 + 2.", said("4"), scenario_id="sum-1", reward=1)],
        split="val", from_step=0, to_step=3,
    )  # fmt: skip
    assert [x.tags for x in diff.examples] == [["newly_right"]]


def test_several_samples_of_one_example_pair_in_order_and_leftovers_are_counted():
    before = [row("q", said(t), trajectory_id=f"b{i}") for i, t in enumerate(["a", "b", "c"])]
    after = [row("q", said(t), trajectory_id=f"a{i}") for i, t in enumerate(["a", "b"])]
    after.append(row("a new question", said("x"), trajectory_id="new"))
    before.append({"group": 0, "exception": "TimeoutError"})  # not an example
    diff = compare_rows(before, after, split="val", from_step=0, to_step=1)
    pairs = [(x.before.trajectory_id, x.after.trajectory_id, x.sample) for x in diff.examples]
    assert pairs == [("b0", "a0", 0), ("b1", "a1", 1)]
    assert (diff.only_before, diff.only_after) == (1, 1)


@pytest.mark.parametrize(
    ("answer", "shape"),
    [
        ([said("Twelve bags.")], "prose"),
        ([said('  {"bags": 12} ')], "JSON"),
        ([said("[1, 2]")], "JSON"),
        ([said("{not json")], "prose"),
        ([said("Here:\n```python\nprint(12)\n```")], "code"),
        ([said("# Stock\n\nTwelve.")], "markdown"),
        ([said("Two:\n1. Kenya\n2. Guji")], "markdown"),
        ([said("It is **twelve**.")], "markdown"),
        ([called("get_item")], "tool call"),
        ([called("get_item"), returned("12", "get_item"), said("12.")], "prose"),  # the last turn
        ([said("")], "empty"),
        ([], "empty"),
    ],
)
def test_the_format_of_an_answer_is_its_last_assistant_turn(answer: list, shape: str):
    assert answer_format(answer) == shape


def test_filters_by_tag_and_text():
    diff = compare_rows(
        [row("a", said("x"), reward=0), row("b", said("same"))],
        [row("a", said("y"), reward=1), row("b", said("same"))],
        split="val", from_step=0, to_step=1,
    )  # fmt: skip
    assert [x.key for x in filter_examples(diff, "newly_right")] == ["user: a"]
    assert [x.key for x in filter_examples(diff, "changed")] == ["user: a"]
    assert [x.key for x in filter_examples(diff, "unchanged")] == ["user: b"]
    assert [x.key for x in filter_examples(diff, "", "SAME")] == ["user: b"]
    assert diff.counts == {
        "newly_right": 1, "newly_wrong": 0, "format_changed": 0, "length_changed": 0,
        "tools_changed": 0, "changed": 1, "unchanged": 1,
    }  # fmt: skip
    with pytest.raises(InvalidRequestError, match="Unknown tag 'better'"):
        filter_examples(diff, "better")


def test_bad_options_are_clear_errors():
    with pytest.raises(InvalidRequestError, match="finite"):
        CorrectnessRule(threshold=float("nan"))
    with pytest.raises(InvalidRequestError, match="length margin"):
        DiffOptions(length_margin=-1)


# ------------------------------------------------------------- logged through the real server


@dataclass(frozen=True)
class Example:
    """A held-out question and its answers at step 0 and step 1."""

    scenario_id: str | None
    question: str
    before: list[dict[str, Any]]
    after: list[dict[str, Any]]
    rewards: tuple[float, float] = (1.0, 1.0)
    correct: tuple[float, float] | None = None  # the `correct` metric, default: the rewards


LONG_PARIS = (
    "The capital of France is Paris, the city on the Seine that is known for its museums, "
    "its cafés and the Eiffel Tower."
)
HELD_OUT = [
    Example("sum", "What is 2 + 2?", [said("I am not sure.")], [said("4")], (0.0, 1.0)),
    # Right, but the reward punishes the long answer: newly wrong by reward, not by `correct`.
    Example(
        "capital",
        "What is the capital of France?",
        [said("Paris")],
        [said(LONG_PARIS)],
        (1.0, 0.0),
        correct=(1.0, 1.0),
    ),
    Example(
        "stock",
        "How many bags of Kenya AA are left?",
        [said("There are 12 bags.")],
        [said('{"bags": 12}')],
    ),
    Example(
        "guji",
        "Is the Ethiopia Guji in stock?",
        [called("get_item"), returned("stock: 3", "get_item"), said("Yes, 3 bags.")],
        [
            called("search"),
            returned("Ethiopia Guji", "search"),
            called("get_item"),
            returned("stock: 3", "get_item"),
            said("Yes, 3 bags."),
        ],
    ),
    Example("sky", "What colour is the sky?", [said("Blue.")], [said("Blue.")]),
    Example(None, "Say hello.", [said("Hello!")], [said("Hello!")]),  # matched by its prompt
    Example("prime", "Name a prime number.", [said("7")], []),  # not asked at step 1
]
EXPECTED_TAGS = {
    "What is 2 + 2?": ["newly_right"],
    "What is the capital of France?": ["newly_wrong", "length_changed"],
    "How many bags of Kenya AA are left?": ["format_changed"],
    "Is the Ethiopia Guji in stock?": ["tools_changed"],
    "What colour is the sky?": [],
    "Say hello.": [],
}


def held_out_groups(at: int) -> list[art.TrajectoryGroup]:
    """The held-out examples' answers at step `at` (0 or 1), one group per question."""
    groups = []
    for example in HELD_OUT:
        answer = example.after if at else example.before
        if not answer:
            continue
        correct = (example.correct or example.rewards)[at]
        trajectory = art.Trajectory(
            messages_and_choices=[{"role": "user", "content": example.question}, *answer],
            reward=example.rewards[at],
            metrics={"correct": correct},
            metadata={"scenario_id": example.scenario_id} if example.scenario_id else {},
        )
        groups.append(art.TrajectoryGroup([trajectory]))
    return groups


async def log_held_out_steps(model: art.TrainableModel) -> None:
    """Val answers at step 0, one train step, val answers at step 1; and a `test` split whose
    steps 0 and 1 ask different questions (nothing to compare)."""
    await model.log(held_out_groups(0), split="val")
    await model.log(held_out_groups_asking("Question A?"), split="test")
    await model.train(varied_group(await groups_for(model, ["What is 1 + 1?"])))
    await model.log(held_out_groups(1), split="val")
    await model.log(held_out_groups_asking("Question B?"), split="test")


def held_out_groups_asking(question: str) -> list[art.TrajectoryGroup]:
    message = {"role": "user", "content": question}
    trajectory = art.Trajectory(messages_and_choices=[message, said("?")], reward=0.0)
    return [art.TrajectoryGroup([trajectory])]


@pytest.fixture(scope="module")
async def logged(
    remote_backend: art.RemoteBackend, training_server: RunningServer, tiny_model_dir: Path
) -> art.TrainableModel:
    model = await fresh_model(remote_backend, tiny_model_dir)
    await log_held_out_steps(model)
    return model


def diff_url(server: RunningServer, model: art.TrainableModel) -> str:
    return f"{server.url}/review/{model.project}/{model.name}/diff"


JSON = {"accept": "application/json"}


async def test_the_diff_of_two_logged_steps_tags_each_example(
    logged: art.TrainableModel, training_server: RunningServer
):
    answer = httpx.get(diff_url(training_server, logged), params={"from": 0, "to": 1}, headers=JSON)
    assert answer.status_code == 200
    diff = answer.json()
    found = {x["prompt"][-1]["content"]: x["tags"] for x in diff["examples"]}
    assert found == EXPECTED_TAGS
    assert diff["counts"] == {
        "newly_right": 1, "newly_wrong": 1, "format_changed": 1, "length_changed": 1,
        "tools_changed": 1, "changed": 4, "unchanged": 2,
    }  # fmt: skip
    assert (diff["compared"], diff["only_before"], diff["only_after"]) == (6, 1, 0)
    assert diff["rule"] == "reward > 0"
    guji = next(x for x in diff["examples"] if x["key"] == "guji")
    assert guji["before"]["tools"] == ["get_item"]
    assert guji["after"]["tools"] == ["search", "get_item"]


async def test_a_named_metric_decides_what_is_right(
    logged: art.TrainableModel, training_server: RunningServer
):
    query = {"from": "0", "to": "1", "metric": "correct", "threshold": "0.5"}
    diff = httpx.get(diff_url(training_server, logged), params=query, headers=JSON).json()
    assert diff["rule"] == "correct > 0.5"
    capital = next(x for x in diff["examples"] if x["key"] == "capital")
    assert capital["tags"] == ["length_changed"]  # right at both steps by `correct`
    assert diff["counts"]["newly_wrong"] == 0


async def test_the_page_shows_counts_filters_and_both_answers(
    logged: art.TrainableModel, training_server: RunningServer
):
    url = diff_url(training_server, logged)
    page = httpx.get(url, params={"from": 0, "to": 1}).text
    assert "<b>6</b> examples compared" in page and "1 only at step 0" in page
    assert 'data-tag="newly_wrong"' in page and "6 of 6 examples shown" in page
    assert page.count('class="box example"') == 6

    wrong = httpx.get(url, params={"from": 0, "to": 1, "tag": "newly_wrong"}).text
    assert wrong.count('class="box example"') == 1 and "1 of 6 examples shown" in wrong
    assert '<div class="text">Paris</div>' in wrong  # step 0's answer
    assert "the city on the Seine" in wrong  # step 1's, beside it
    assert 'class="card answer before"' in wrong and 'class="card answer after"' in wrong

    text = httpx.get(url, params={"from": 0, "to": 1, "q": "guji"}).text
    assert text.count('class="box example"') == 1 and "tool call</b> search" in text

    model_page = httpx.get(f"{training_server.url}/review/{logged.project}/{logged.name}/").text
    assert f'href="/review/{logged.project}/{logged.name}/diff"' in model_page
    picker = httpx.get(url)  # no steps chosen yet: the form, with the val steps to pick
    assert picker.status_code == 200 and '<option value="1" selected>' in picker.text


@pytest.mark.parametrize(
    ("path", "query", "status", "message"),
    [
        ("tests/no-such-model", {"from": 0, "to": 1}, 404, "No model tests/no-such-model"),
        (None, {"from": 0, "to": 5}, 404, "its val steps are 0, 1"),
        (None, {"from": 0, "to": 1, "split": "eval"}, 404, "has no 'eval' trajectories"),
        (None, {"from": 1, "to": 1}, 400, "name two different steps"),
        (None, {"from": 0, "to": 1, "split": "test"}, 400, "share no example"),
        (None, {"from": 0}, 400, "Give both `from` and `to`"),
        (None, {"from": "first", "to": 1}, 400, "`from` must be a step number"),
        (None, {"from": 0, "to": 1, "threshold": "nan"}, 400, "finite"),
        (None, {"from": 0, "to": 1, "tag": "better"}, 400, "Unknown tag 'better'"),
        (None, {"from": 0, "to": 1, "step": 1}, 400, "Unknown field 'step'"),
        (None, {}, 400, "Give `from` and `to`"),  # JSON without steps: nothing to answer
    ],
)
async def test_bad_requests_are_4xx_saying_what_to_do(
    logged: art.TrainableModel,
    training_server: RunningServer,
    path: str | None,
    query: dict,
    status: int,
    message: str,
):
    url = f"{training_server.url}/review/{path}/diff" if path else diff_url(training_server, logged)
    answer = httpx.get(url, params=query, headers=JSON)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]
    # `format=json` asks as the header does: the error is JSON too, not the HTML page.
    linked = httpx.get(url, params={**query, "format": "json"})
    assert linked.status_code == status and linked.json() == answer.json()
    if query:  # the HTML page says the same
        html = httpx.get(url, params=query)
        assert html.status_code == status and "text/html" in html.headers["content-type"]


async def test_format_json_in_the_query_answers_what_the_accept_header_does(
    logged: art.TrainableModel, training_server: RunningServer
):
    """A link cannot set a header: `format=json` was a 400 HTML page ("Unknown field")."""
    url = diff_url(training_server, logged)
    by_header = httpx.get(url, params={"from": 0, "to": 1}, headers=JSON)
    by_query = httpx.get(url, params={"from": 0, "to": 1, "format": "json"})
    assert by_query.status_code == 200, by_query.text
    assert by_query.headers["content-type"] == "application/json"
    assert by_query.json() == by_header.json()
    page = httpx.get(url, params={"from": 0, "to": 1, "format": "html"}, headers=JSON)
    assert page.status_code == 200 and "<b>6</b> examples compared" in page.text
    other = httpx.get(url, params={"from": 0, "to": 1, "format": "xml"}, headers=JSON)
    assert other.status_code == 400 and other.json()["error"]["param"] == "format"
    assert "Unknown format 'xml': use json" in other.json()["error"]["message"]


# ------------------------------------------------------------------------------------ art diff


def run_diff(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = diff_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_art_diff_prints_counts_and_the_changed_examples(
    logged: art.TrainableModel, training_server: RunningServer, capsys: pytest.CaptureFixture
):
    path = str(training_server.art_path)
    code, out, _ = run_diff(
        capsys, "--model", logged.name, "--from", "0", "--to", "1", "--path", path
    )
    assert code == 0
    assert f"{logged.project}/{logged.name} val: step 0 -> step 1, 6 examples compared" in out
    assert "newly right 1, newly wrong 1, format changed 1" in out and "unchanged 2" in out
    assert "not compared: 1 only at step 0" in out
    assert "[newly wrong, length changed] What is the capital of France?" in out
    assert "step 0 (reward 1, right, prose, 5 chars, tools: none): Paris" in out
    assert "What colour is the sky?" not in out  # unchanged: not printed unless asked

    code, out, _ = run_diff(
        capsys,
        "--model",
        f"{logged.project}/{logged.name}",
        "--from",
        "0",
        "--to",
        "1",
        "--path",
        path,
        "--json",
        "--tag",
        "tools_changed",
    )
    assert code == 0
    printed = json.loads(out)
    assert [x["key"] for x in printed["examples"]] == ["guji"]
    assert printed["counts"]["changed"] == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "nobody"], "No model 'nobody' under"),
        (["--to", "0"], "name two different steps"),
        (["--to", "7"], "its val steps are 0, 1"),
        (["--split", "test"], "share no example"),
        (["--split", "eval"], 'model.log(groups, split="eval")'),
        (["--metric", "correct", "--threshold", "nan"], "finite"),
    ],
)
async def test_art_diff_refuses_bad_input_with_a_message(
    logged: art.TrainableModel,
    training_server: RunningServer,
    capsys: pytest.CaptureFixture,
    argv: list[str],
    message: str,
):
    defaults = {"--model": logged.name, "--from": "0", "--to": "1"}
    defaults.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    args = [part for pair in defaults.items() for part in pair]
    code, out, err = run_diff(capsys, *args, "--path", str(training_server.art_path))
    assert code == 2 and out == ""
    assert err.startswith("art diff: error: ") and message in err


def damage_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


# How a trajectories file can be damaged on disk, and what the message then says.
DAMAGED_SHAPES = {
    "a folder": (damage_folder, "are a folder, not a file: move the folder away"),
    "empty": (lambda path: path.write_bytes(b""), "the file is empty"),
    "cut short": (lambda path: path.write_bytes(path.read_bytes()[:20]), "damaged section"),
    "garbage bytes": (lambda path: path.write_bytes(b"\x00garbage" * 9), "damaged section"),
    "garbage JSON": (lambda path: path.write_bytes(gzip.compress(b"{not json\n[1]\n")), "2 unreadable"),
    "JSON of another shape": (
        lambda path: path.write_bytes(gzip.compress(b'{"id": "t", "histories": 5}\n')),
        "1 record(s) not shaped as a logged trajectory",
    ),
}  # fmt: skip


def two_logged_steps(root: Path) -> Path:
    """A `.art` folder whose model m logged val steps 0 and 1 (no server); step 1's file."""
    store = ModelStore(root, "p", "m")
    store.write_trajectories("val", 0, [row("2+2?", said("five"), reward=0, scenario_id="sum")])
    return store.write_trajectories("val", 1, [row("2+2?", said("4"), scenario_id="sum")])


@pytest.mark.parametrize("shape", DAMAGED_SHAPES)
def test_art_diff_names_a_damaged_trajectories_file_and_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture, shape: str
):
    damage, message = DAMAGED_SHAPES[shape]
    path = two_logged_steps(tmp_path)
    damage(path)
    code, out, err = run_diff(capsys, "--model", "m", "--from", "0", "--to", "1",
                              "--path", str(tmp_path))  # fmt: skip
    assert code == 2 and out == ""
    assert err.startswith(f"art diff: error: The val trajectories of step 1 ({path})")
    assert message in err and "log the step again" in err and err.count("\n") == 1


def test_the_diff_page_answers_a_damaged_file_with_a_409_naming_it(tmp_path: Path):
    from fastapi.testclient import TestClient

    from art_backend.review._app import create_review_app

    damage_folder(two_logged_steps(tmp_path))
    page = TestClient(create_review_app(tmp_path))
    answer = page.get("/p/m/diff", params={"from": 0, "to": 1}, headers=JSON)
    assert answer.status_code == 409, answer.text
    assert "are a folder, not a file" in answer.json()["error"]["message"]


def test_art_diff_compares_what_a_partly_damaged_file_holds_and_says_what_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    path = two_logged_steps(tmp_path)
    with open(path, "ab") as out:  # a torn last write
        out.write(gzip.compress(b'{"id": "t2"}\n')[:15])
    code, out, _ = run_diff(capsys, "--model", "m", "--from", "0", "--to", "1",
                            "--path", str(tmp_path), "--json")  # fmt: skip
    assert code == 0
    diff = json.loads(out)
    assert diff["counts"]["newly_right"] == 1
    [note] = diff["notes"]
    assert note.startswith("val step 1: the file is damaged") and "1 damaged section" in note


def test_art_diff_needs_an_existing_folder(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "art_backend.review.diff_cli", "--model", "m", "--from", "0",
         "--to", "1", "--path", str(tmp_path / "missing")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and "no folder" in result.stderr


def test_the_art_command_runs_diff_and_refuses_a_step_that_is_not_a_number(tmp_path: Path):
    art_command = Path(sys.executable).with_name("art")
    assert art_command.is_file(), "no `art` next to python: pip install -e . registers it"
    result = subprocess.run(
        [str(art_command), "diff", "--model", "m", "--from", "x", "--to", "1",
         "--path", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert "art diff: error: argument --from: invalid int value: 'x'" in result.stderr


def test_art_diff_is_declared_as_an_art_subcommand():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    commands = pyproject["project"]["entry-points"]["art_trainer.commands"]
    assert commands["diff"] == "art_backend.review.diff_cli:main"
