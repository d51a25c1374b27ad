"""The review pages over HTTP (`art review`'s app on 127.0.0.1): browse, filter, decide, refuse."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.review_data import (
    MODEL,
    PROJECT,
    start_review_server,
    tool_trajectory,
    write_review_store,
)
from tests.support.servers import free_port

MODEL_PAGE = f"/review/{PROJECT}/{MODEL}"
STEP0 = f"{MODEL_PAGE}/steps/train/0"


@pytest.fixture(scope="module")
def review(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("review-art")
    write_review_store(root)
    server, thread, url = start_review_server(root)
    with httpx.Client(base_url=url, timeout=30) as client:
        client.root = root  # type: ignore[attr-defined]
        yield client
    server.should_exit = True
    thread.join(10)


def trajectories_on(page: str) -> list[str]:
    return re.findall(r'data-trajectory="([^"]+)"', page)


def chips_on(page: str) -> list[str]:
    return re.findall(r'<a class="[^"]*" title="([^"]+)"', page)


def decide(review: httpx.Client, step: str, **form: str) -> httpx.Response:
    return review.post(f"{MODEL_PAGE}/steps/{step}/decisions", data=form)


# ------------------------------------------------------------------------------------ browse


def test_the_index_lists_models_and_links_to_them(review: httpx.Client):
    page = review.get("/review/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'href="{MODEL_PAGE}/"' in page.text
    assert review.get("/", follow_redirects=True).url.path == "/review/"


def test_a_model_shows_its_reward_curve_metric_plots_and_steps(review: httpx.Client):
    page = review.get(f"{MODEL_PAGE}/").text
    assert page.count("<svg") == 3  # reward (train and val), loss, entropy
    assert 'aria-label="reward (x: step sampled at)"' in page and "<polyline" in page
    for step in ("train/0", "train/1", "val/2"):
        assert f'href="{MODEL_PAGE}/steps/{step}"' in page
    assert review.get(f"{MODEL_PAGE}/?metrics=all").status_code == 200


def test_a_step_shows_its_metrics_reward_strip_and_groups(review: httpx.Client):
    page = review.get(STEP0).text
    assert 'aria-label="rewards by group"' in page
    assert "0.4375" in page  # the reward of the history row of step 1 (sampled at 0)
    assert 'data-group="0"' in page and 'data-group="1"' in page
    assert "1 exceptions" in page


def test_a_group_shows_its_trajectories_side_by_side_best_first(review: httpx.Client):
    page = review.get(f"{STEP0}/groups/1").text
    assert trajectories_on(page) == ["t0-c", "t0-d"]  # rewards 0.5, 0.25
    assert "tool call</b> get_item" in page and "&quot;name&quot;: &quot;Kenya AA&quot;" in page
    assert "tool result · call-t0-c" in page and "stock: 12" in page
    assert "<b>judge</b> run t0-c answered About a dozen" in page  # the RULER explanation
    assert "advantage 0.7" in page and "advantage -0.7" in page
    assert "TimeoutError: the tool took too long" in page
    assert "num_turns" in page  # metrics


def test_text_from_the_store_is_escaped(review: httpx.Client):
    page = review.get(f"{STEP0}/groups/0").text
    assert "12 bags &lt;script&gt;x&lt;/script&gt;" in page
    assert "<script>" not in page


def test_a_trajectory_has_its_own_page(review: httpx.Client):
    page = review.get(f"{STEP0}/trajectories/t0-b").text
    assert trajectories_on(page) == ["t0-b"] and "I do not know" in page
    assert 'class="inline flag-trajectory"' in page and 'class="inline override-reward"' in page


# ----------------------------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"min_reward": "0.5"}, ["t0-a", "t0-c"]),
        ({"max_reward": "0.25"}, ["t0-b", "t0-d"]),
        ({"q": "DOZEN"}, ["t0-c"]),  # message text, case-insensitive
        ({"q": "answered twelve"}, ["t0-d"]),  # logs are searched too
        ({"exceptions": "on"}, ["t0-c", "t0-d"]),  # groups with exceptions
        (
            {"metric": "num_turns", "metric_min": "2", "metric_max": "2"},
            ["t0-a", "t0-b", "t0-c", "t0-d"],
        ),
        ({"metric": "num_turns", "metric_min": "3"}, []),
        ({"metric": "no_such_metric"}, []),
    ],
)
def test_step_filters(review: httpx.Client, query: dict, expected: list[str]):
    page = review.get(STEP0, params=query)
    assert page.status_code == 200
    assert sorted(chips_on(page.text)) == sorted(expected)


def test_search_across_steps_and_splits(review: httpx.Client):
    everything = review.get(f"{MODEL_PAGE}/search", params={"min_reward": "0.8"}).text
    assert "3 trajectories match" in everything  # t0-a (1.0), t1-a (0.9), v-a (0.8)
    val = review.get(f"{MODEL_PAGE}/search", params={"min_reward": "0.8", "split": "val"}).text
    assert "1 trajectories match" in val and f"{MODEL_PAGE}/steps/val/2/trajectories/v-a" in val


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"min_reward": "high"}, "min_reward"),
        ({"max_reward": "nan"}, "max_reward"),
        ({"metric_min": "inf"}, "metric_min"),
        ({"exceptions": "maybe"}, "exceptions"),
        ({"reward": "1"}, "reward"),  # not a filter
    ],
)
def test_bad_filters_are_400_naming_the_field(review: httpx.Client, query: dict, param: str):
    page = review.get(STEP0, params=query, headers={"accept": "application/json"})
    assert page.status_code == 400
    assert page.json()["error"]["param"] == param


# ------------------------------------------------------------------------------- not found


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/review/nope/agent-1/", "No model nope/agent-1 under"),
        (f"/review/{PROJECT}/ghost/", f"the models there are {PROJECT}/{MODEL}"),
        (f"{MODEL_PAGE}/steps/train/7", "its train steps are 0, 1"),
        (f"{MODEL_PAGE}/steps/test/0", "it has no 'test' steps"),
        (f"{MODEL_PAGE}/steps/train/x", "No 'train' step 'x'"),
        (f"{MODEL_PAGE}/steps/val/²", "No 'val' step '²'"),  # str.isdigit() says yes: was a 500
        (f"{STEP0}/groups/9", "it has groups 0, 1"),
        (f"{STEP0}/trajectories/missing", "No trajectory 'missing' in train step 0"),
        (f"{MODEL_PAGE}/steps/_pending/abcdefabcdef", "is held for review"),
        ("/review/a/b/c/d/e/f/g/h", "No review page at"),
    ],
)
def test_unknown_things_are_404_saying_what_exists(review: httpx.Client, path: str, message: str):
    page = review.get(path)
    assert page.status_code == 404
    assert message in page.text.replace("&#x27;", "'")


def test_unknown_model_page_options_are_400(review: httpx.Client):
    assert review.get(f"{MODEL_PAGE}/?metrics=some").status_code == 400


# --------------------------------------------------------------------------------- decisions


def test_flag_a_trajectory_then_withdraw_it(review: httpx.Client):
    root: Path = review.root  # type: ignore[attr-defined]
    answer = decide(
        review, "train/1", action="flag_trajectory", trajectory_id="t1-b",
        reason="answered from memory, not the tool", who="ann",
    )  # fmt: skip
    assert answer.status_code == 303
    assert answer.headers["location"] == f"{MODEL_PAGE}/steps/train/1/trajectories/t1-b"
    assert "art_review_who=ann" in answer.headers["set-cookie"]

    rows = [
        json.loads(line)
        for line in (root / PROJECT / "models" / MODEL / "review" / "decisions.jsonl")
        .read_text()
        .splitlines()
    ]
    flag = rows[-1]
    assert flag["action"] == "flag_trajectory" and flag["trajectory_id"] == "t1-b"
    assert flag["who"] == "ann" and flag["where"] == {"split": "train", "step": "1", "group": 0}
    assert "answered from memory" in flag["reason"] and flag["at"] > 0

    page = review.get(f"{MODEL_PAGE}/steps/train/1/trajectories/t1-b").text
    assert '<span class="badge flag">flagged</span>' in page and "Flagged by ann" in page
    flagged = review.get(f"{MODEL_PAGE}/steps/train/1", params={"flagged": "on"}).text
    assert chips_on(flagged) == ["t1-b"]
    assert "answered from memory" in review.get(f"{MODEL_PAGE}/").text  # the decision log

    withdrawn = decide(
        review,
        "train/1",
        action="withdraw_trajectory",
        trajectory_id="t1-b",
        reason="it did use it",
    )
    assert withdrawn.status_code == 303
    assert chips_on(review.get(f"{MODEL_PAGE}/steps/train/1", params={"flagged": "on"}).text) == []


def test_flag_a_group_and_override_a_reward_as_json(review: httpx.Client):
    json_accept = {"accept": "application/json"}
    group = review.post(
        f"{STEP0}/decisions",
        data={"action": "flag_group", "group": "1", "reason": "the tool timed out"},
        headers=json_accept,
    )
    assert group.status_code == 200
    assert sorted(group.json()["decision"]["trajectory_ids"]) == ["t0-c", "t0-d"]
    override = review.post(
        f"{STEP0}/decisions",
        data={
            "action": "override_reward",
            "trajectory_id": "t0-b",
            "reward": "0.75",
            "reason": "partly right",
        },
        headers=json_accept,
    )
    assert override.json()["decision"]["reward"] == 0.75

    page = review.get(f"{STEP0}/groups/0").text
    assert trajectories_on(page) == ["t0-a", "t0-b"] and "0 → <b>0.75</b>" in page
    assert "Group flagged" in review.get(f"{STEP0}/groups/1").text
    assert sorted(chips_on(review.get(STEP0, params={"min_reward": "0.7"}).text)) == [
        "t0-a",
        "t0-b",
    ]


@pytest.mark.parametrize(
    ("form", "status", "message"),
    [
        (
            {"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "   "},
            400,
            "A reason is required",
        ),
        ({"action": "flag_trajectory", "trajectory_id": "t0-a"}, 400, "A reason is required"),
        (
            {"action": "override_reward", "trajectory_id": "t0-a", "reward": "inf", "reason": "r"},
            400,
            "finite",
        ),
        (
            {"action": "override_reward", "trajectory_id": "t0-a", "reward": "nan", "reason": "r"},
            400,
            "finite",
        ),
        (
            {"action": "override_reward", "trajectory_id": "t0-a", "reward": "lots", "reason": "r"},
            400,
            "must be a number",
        ),
        ({"action": "erase", "trajectory_id": "t0-a", "reason": "r"}, 400, "Unknown action"),
        (
            {"action": "flag_trajectory", "trajectory_id": "ghost", "reason": "r"},
            404,
            "No trajectory 'ghost'",
        ),
        ({"action": "flag_group", "group": "5", "reason": "r"}, 404, "No group '5'"),
        (
            {"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "x" * 2001},
            400,
            "keep it under",
        ),
    ],
)
def test_bad_decisions_are_refused_and_not_recorded(
    review: httpx.Client, form: dict, status: int, message: str
):
    root: Path = review.root  # type: ignore[attr-defined]
    log = root / PROJECT / "models" / MODEL / "review" / "decisions.jsonl"
    before = log.read_text() if log.exists() else ""
    answer = review.post(f"{STEP0}/decisions", data=form, headers={"accept": "application/json"})
    assert answer.status_code == status
    assert message in answer.json()["error"]["message"]
    assert (log.read_text() if log.exists() else "") == before


def test_approving_a_step_that_is_not_held_is_404(review: httpx.Client):
    answer = review.post(f"{MODEL_PAGE}/pending/abcdefabcdef/approve", data={})
    assert answer.status_code == 404 and "already trained" in answer.text


def test_a_redirect_never_leaves_the_review_page(review: httpx.Client):
    answer = decide(
        review, "train/0", action="flag_trajectory", trajectory_id="t0-a", reason="r",
        next="https://evil.example/",
    )  # fmt: skip
    assert answer.headers["location"] == "/review/"


def test_a_form_posted_from_another_site_is_refused(review: httpx.Client):
    answer = review.post(
        f"{STEP0}/decisions",
        data={"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "csrf"},
        headers={"origin": "https://evil.example"},
    )
    assert answer.status_code == 403 and "another site" in answer.text
    same_site = review.post(
        f"{STEP0}/decisions",
        data={"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "from the page"},
        headers={"origin": str(review.base_url).rstrip("/")},
    )
    assert same_site.status_code == 303


# ------------------------------------------------------------------------------ art review


def test_art_review_serves_a_folder_without_loading_a_model(tmp_path: Path):
    write_review_store(tmp_path)
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "art_core.cli",
            "review",
            "--path",
            str(tmp_path),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "ART_API_KEY": ""},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/review/")
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"art review did not start:\n{process.stdout.read()}"
                    ) from None  # type: ignore[union-attr]
                time.sleep(0.1)
        assert page.status_code == 200 and f"{PROJECT}/{MODEL}" in page.text
    finally:
        process.terminate()
        process.wait(10)


def test_art_review_needs_an_existing_folder(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "art_core.cli", "review", "--path", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "no folder" in result.stderr


def test_the_review_app_does_not_import_torch():
    code = "import sys, art_backend.review.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pages_show_a_lone_surrogate_on_disk_instead_of_failing(tmp_path: Path):
    """Files written before lone surrogates were refused (json.dumps escapes them as \\ud800):
    the step, group and search pages show U+FFFD where the half stood."""
    store = write_review_store(tmp_path)
    half = "\ud800"
    row = {"group": 0, **tool_trajectory(f"t5-{half}", 1.0, f"twelve {half} bags", advantage=1.0)}
    store.write_trajectories("train", 5, [row])
    store.append_history({"type": "log", "split": "val", "step": 5, "metrics": {f"m{half}": 1.0}})
    server, thread, url = start_review_server(tmp_path)
    try:
        for path in [
            f"{MODEL_PAGE}/steps/train/5",
            f"{MODEL_PAGE}/steps/train/5/groups/0",
            f"{MODEL_PAGE}/search?q=twelve",
            f"{MODEL_PAGE}/",
        ]:
            page = httpx.get(f"{url}{path}")
            assert page.status_code == 200, (path, page.text[:300])
        step_page = httpx.get(f"{url}{MODEL_PAGE}/steps/train/5").text
        assert "t5-\ufffd" in step_page
        link = re.search(r'href="([^"]*/trajectories/t5-[^"]*)"', step_page)
        assert link is not None
        trajectory = httpx.get(f"{url}{link.group(1)}")
        assert trajectory.status_code == 200 and "twelve \ufffd bags" in trajectory.text
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_step_whose_trajectories_file_is_a_folder_is_a_409_naming_it(tmp_path: Path):
    """A folder where a step's file belongs: its pages answer 409 with the path and what to do
    (a 500 before), the search lists the step as damaged, and the other pages still serve."""
    store = write_review_store(tmp_path)
    folder = store.trajectories_path("train", 1)
    folder.unlink()
    folder.mkdir()
    server, thread, url = start_review_server(tmp_path)
    try:
        step1 = f"{url}{MODEL_PAGE}/steps/train/1"
        for page in (step1, f"{step1}/groups/0", f"{step1}/trajectories/t1-a"):
            answer = httpx.get(page)
            assert answer.status_code == 409, (page, answer.text[:300])
            assert f"({folder}) are a folder, not a file: move the folder away" in answer.text
            as_json = httpx.get(page, headers={"Accept": "application/json"})
            assert as_json.status_code == 409
            assert as_json.json()["error"]["type"] == "conflict_error"
        form = {"action": "flag_trajectory", "trajectory_id": "t1-a", "reason": "why"}
        flag = httpx.post(f"{step1}/decisions", data=form)
        assert flag.status_code == 409 and "are a folder, not a file" in flag.text
        search = httpx.get(f"{url}{MODEL_PAGE}/search", params={"q": "bags"})
        assert search.status_code == 200 and "Damaged trajectories files" in search.text
        assert "train step 1" in search.text and "t0-a" in search.text
        for page in (f"{MODEL_PAGE}/", STEP0, f"{MODEL_PAGE}/steps/val/2"):
            assert httpx.get(f"{url}{page}").status_code == 200, page
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_step_whose_trajectories_file_cannot_be_read_is_a_409_naming_it(tmp_path: Path):
    """A path the server cannot open (a symbolic link to itself; a 500 before): 409 with the
    path, why, and what to do."""
    store = write_review_store(tmp_path)
    path = store.trajectories_path("train", 1)
    path.unlink()
    path.symlink_to(path.name)  # opening it loops
    server, thread, url = start_review_server(tmp_path)
    try:
        answer = httpx.get(f"{url}{MODEL_PAGE}/steps/train/1")
        assert answer.status_code == 409, answer.text[:300]
        text = html.unescape(answer.text)
        assert f"{path} cannot be resolved (" in text
        assert "remove or replace the symbolic link there" in text
        assert httpx.get(f"{url}{STEP0}").status_code == 200  # the other steps still serve
    finally:
        server.should_exit = True
        thread.join(10)
