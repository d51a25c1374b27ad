"""Decisions made in Langfuse on a held step's traces reach the trainer like the review page's.

A real art-server holds the step (`review_hold_seconds`); the loopback Langfuse (no real
Langfuse server runs here) serves the scores and annotation-queue items a person would set in
its UI, in the shapes of its public REST API; the client's `LangfuseObserver(review=...)` reads
them and posts them to the review page's route with `source=langfuse`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import httpx
import pytest
from langfuse.api.annotation_queues.types import PaginatedAnnotationQueueItems
from langfuse.api.core.pydantic_utilities import parse_obj_as
from langfuse.api.scores.types import GetScoresV3Response

import art_core as art
from art_backend.store._review_decisions import PendingStep, list_pending, read_decisions
from art_backend.testing import read_trajectories
from art_core.trackers.langfuse import LangfuseObserver, LangfuseReview
from art_core.trackers.langfuse._review import Score, decisions_from_scores
from art_core.trackers.langfuse._trace import trace_id_for
from tests.support.langfuse_receiver import (
    PUBLIC_KEY,
    SECRET_KEY,
    LangfuseReceiver,
    exporter,
    langfuse_receiver,
    langfuse_receiver_server,
)
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer

__all__ = ["exporter", "langfuse_receiver", "langfuse_receiver_server"]

QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]
FAST = LangfuseReview(poll_seconds=0.1)
AUTH = (PUBLIC_KEY, SECRET_KEY)


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


def model_dir(server: RunningServer, model: art.TrainableModel) -> Path:
    return Path(server.art_path) / model.project / "models" / model.name


def logged_rows(server: RunningServer, model: art.TrainableModel, step: int) -> dict[str, dict]:
    path = model_dir(server, model) / "trajectories" / "train" / f"{step:04d}.jsonl.gz"
    return {row["id"]: row for row in read_trajectories(path) if "id" in row}


async def until(condition, what: str, seconds: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def held_and_in_langfuse(
    server: RunningServer,
    model: art.TrainableModel,
    receiver: LangfuseReceiver,
    groups: list[art.TrajectoryGroup],
) -> PendingStep:
    """The step is held, and its traces reached Langfuse during the hold."""
    held = await until(lambda: list_pending(model_dir(server, model)), "a held step")
    trace_ids = {trace_id_for(t.id) for group in groups for t in group}
    await until(lambda: trace_ids <= set(receiver.traces()), "the held step's traces sent")
    return held[0]


def langfuse_rows(server: RunningServer, model: art.TrainableModel) -> list[dict]:
    rows = read_decisions(model_dir(server, model))
    return [row for row in rows if row.get("source") == "langfuse"]


def approve(server: RunningServer, model: art.TrainableModel, held: PendingStep) -> None:
    url = f"{server.url}/review/{model.project}/{model.name}/pending/{held.id}/approve"
    assert httpx.post(url, data={"who": "ann"}).status_code == 303


async def test_a_veto_score_set_in_langfuse_on_a_held_trace_vetoes_that_trajectory(
    model: art.TrainableModel,
    exporter: art.LangfuseExporter,
    langfuse_receiver: LangfuseReceiver,
    training_server: RunningServer,
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    model.observers = [LangfuseObserver(exporter, review=FAST)]
    training = asyncio.create_task(
        model.train(groups, config=art.TrainConfig(review_hold_seconds=600))
    )
    held = await held_and_in_langfuse(training_server, model, langfuse_receiver, groups)
    vetoed = groups[1].trajectories[2]
    langfuse_receiver.add_score(trace_id_for(vetoed.id), "art_veto", 1, comment="looped")
    [row] = await until(lambda: langfuse_rows(training_server, model), "the veto posted")
    assert row["action"] == "flag_trajectory" and row["trajectory_id"] == vetoed.id
    assert row["who"] == "user-ann" and "looped" in row["reason"]
    assert row["where"]["split"] == "_pending" and row["where"]["step"] == held.id
    assert not training.done()  # a score alone does not release the hold

    approve(training_server, model, held)
    result = await asyncio.wait_for(training, 120)

    assert result.metrics["review/flagged_trajectories"] == 1
    assert result.metrics["rows"] == 7  # 8 submitted, the vetoed one left out
    note = logged_rows(training_server, model, 0)[vetoed.id]["review"]
    assert note["applied"] == "flagged_trajectories" and "looped" in note["reason"]
    page = httpx.get(f"{training_server.url}/review/{model.project}/{model.name}/").text
    assert "<th>source</th>" in page and "<td>langfuse</td>" in page and "<td>page</td>" in page
    trajectory_page = httpx.get(
        f"{training_server.url}/review/{model.project}/{model.name}/steps/train/0"
        f"/trajectories/{vetoed.id}"
    ).text
    assert "by user-ann in Langfuse" in trajectory_page
    observer_metrics = model.observers[0].step_metrics(model)
    assert observer_metrics["langfuse/review_decisions"] == 1
    assert observer_metrics["langfuse/held_traces_sent"] == 8


async def test_a_reward_score_overrides_the_reward_and_a_later_page_decision_wins(
    model: art.TrainableModel,
    exporter: art.LangfuseExporter,
    langfuse_receiver: LangfuseReceiver,
    training_server: RunningServer,
):
    groups = varied_group(await groups_for(model, QUESTIONS))
    model.observers = [LangfuseObserver(exporter, review=FAST)]
    training = asyncio.create_task(
        model.train(groups, config=art.TrainConfig(review_hold_seconds=600))
    )
    held = await held_and_in_langfuse(training_server, model, langfuse_receiver, groups)
    raised, contested = groups[0].trajectories[0], groups[0].trajectories[1]
    langfuse_receiver.add_score(trace_id_for(raised.id), "art_reward", 10.0)
    langfuse_receiver.add_score(trace_id_for(contested.id), "art_reward", 7.0)
    await until(lambda: len(langfuse_rows(training_server, model)) == 2, "two overrides posted")

    # The page overrides the contested reward afterwards: the latest decision wins, and the
    # unchanged Langfuse score is not posted again over it.
    decisions = f"{training_server.url}/review/{model.project}/{model.name}/steps/_pending/{held.id}/decisions"
    form = {"action": "override_reward", "trajectory_id": contested.id, "reward": "-3"}
    page = httpx.post(
        decisions, data={**form, "reason": "wrong"}, headers={"accept": "application/json"}
    )
    assert page.json()["decision"]["source"] == "page"
    bogus = httpx.post(decisions, data={**form, "reason": "x", "source": "slack"})
    assert bogus.status_code == 400 and "source" in bogus.text
    await asyncio.sleep(0.5)  # several polls
    assert len(langfuse_rows(training_server, model)) == 2

    approve(training_server, model, held)
    result = await asyncio.wait_for(training, 120)

    assert result.metrics["review/reward_overrides"] == 2
    rows = logged_rows(training_server, model, 0)
    assert rows[raised.id]["reward"] == 10.0 and rows[raised.id]["advantage"] > 0
    assert rows[contested.id]["reward"] == -3.0


async def test_a_completed_annotation_queue_approves_the_held_step(
    model: art.TrainableModel,
    exporter: art.LangfuseExporter,
    langfuse_receiver: LangfuseReceiver,
    training_server: RunningServer,
):
    langfuse_receiver.add_queue("queue-art")
    review = LangfuseReview(annotation_queue="queue-art", poll_seconds=0.1)
    groups = varied_group(await groups_for(model, QUESTIONS))
    model.observers = [LangfuseObserver(exporter, review=review)]
    training = asyncio.create_task(
        model.train(groups, config=art.TrainConfig(review_hold_seconds=600))
    )
    await held_and_in_langfuse(training_server, model, langfuse_receiver, groups)
    items = await until(lambda: len(langfuse_receiver.queues["queue-art"]) == 8 and
                        langfuse_receiver.queues["queue-art"], "the traces queued")  # fmt: skip
    expected = {trace_id_for(t.id) for group in groups for t in group}
    assert {item["objectId"] for item in items} == expected
    assert {(item["objectType"], item["status"]) for item in items} == {("TRACE", "PENDING")}

    vetoed = groups[0].trajectories[3]
    langfuse_receiver.add_score(trace_id_for(vetoed.id), "art_veto", True)
    await asyncio.sleep(0.6)  # PENDING items keep the step held
    assert not training.done()
    langfuse_receiver.set_queue_status("queue-art", "COMPLETED")
    result = await asyncio.wait_for(training, 120)

    assert result.metrics["review/flagged_trajectories"] == 1 and result.metrics["rows"] == 7
    actions = [row["action"] for row in langfuse_rows(training_server, model)]
    assert actions == ["flag_trajectory", "approve"]


async def test_langfuse_unreachable_warns_once_counts_and_training_goes_on(
    model: art.TrainableModel,
    training_server: RunningServer,
    caplog: pytest.LogCaptureFixture,
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    dead = art.LangfuseExporter(
        public_key=PUBLIC_KEY,
        secret_key=SECRET_KEY,
        host=f"http://127.0.0.1:{closed_port}",
        timeout=0.5,
    )
    observer = LangfuseObserver(dead, review=LangfuseReview(poll_seconds=0.05))
    model.observers = [observer]
    groups = varied_group(await groups_for(model, QUESTIONS))
    with caplog.at_level(logging.WARNING, logger="art_core.langfuse"):
        result = await model.train(groups, config=art.TrainConfig(review_hold_seconds=1.5))
    dead.close(timeout=5)

    assert result.step == 1 and result.metrics["rows"] == 8
    warnings = [r for r in caplog.records if "review read-back failed" in r.getMessage()]
    assert len(warnings) == 1
    assert observer.step_metrics(model)["langfuse/review_read_errors"] >= 1


def test_the_loopback_answers_parse_as_the_sdks_models(langfuse_receiver: LangfuseReceiver):
    trace_id = "ab" * 16
    langfuse_receiver.add_score(trace_id, "art_veto", True, comment="off topic")
    langfuse_receiver.add_score(trace_id, "art_reward", 0.5)
    langfuse_receiver.add_score(trace_id, "label", "bad")
    answer = httpx.get(
        f"{langfuse_receiver.url}/api/public/v3/scores",
        params={"traceId": trace_id, "fields": "details,subject,annotation", "limit": 2},
        auth=AUTH,
    ).json()
    page = parse_obj_as(GetScoresV3Response, answer)
    assert [s.data_type for s in page.data] == ["BOOLEAN", "NUMERIC"]
    subject = page.data[0].subject
    assert page.data[0].comment == "off topic" and subject is not None and subject.id == trace_id
    assert page.meta.cursor is not None  # a third score on the next page

    langfuse_receiver.add_queue("q")
    queue_url = f"{langfuse_receiver.url}/api/public/annotation-queues/q/items"
    created = httpx.post(queue_url, json={"objectId": trace_id, "objectType": "TRACE"}, auth=AUTH)
    assert created.json()["status"] == "PENDING"
    items = parse_obj_as(PaginatedAnnotationQueueItems, httpx.get(queue_url, auth=AUTH).json())
    assert items.meta.total_items == 1 and items.data[0].object_id == trace_id
    missing = httpx.get(
        f"{langfuse_receiver.url}/api/public/annotation-queues/nope/items", auth=AUTH
    )
    assert missing.status_code == 404


def test_scores_become_decisions_once_per_version():
    review = LangfuseReview()
    trajectories = {"t1": "a", "t2": "b"}

    def score(id: str, trace: str, name: str, value, at: float) -> Score:  # type: ignore[no-untyped-def]
        return Score(id=id, trace_id=trace, name=name, value=value, timestamp=at)

    scores = [
        score("s1", "t1", "art_veto", 0, 1.0),
        score("s2", "t1", "art_veto", "yes", 2.0),  # the latest of a name on a trace counts
        score("s3", "t2", "art_reward", "high", 1.0),  # not a number: ignored
        score("s4", "t9", "art_veto", 1, 1.0),  # not this step's trace
    ]
    [flag] = decisions_from_scores(scores, trajectories, review, {})
    assert (flag.action, flag.trajectory_id, flag.form()["source"]) == (
        "flag_trajectory", "a", "langfuse",
    )  # fmt: skip
    assert decisions_from_scores(scores, trajectories, review, {("a", "veto"): flag.version}) == []
    cleared = [*scores, score("s5", "t1", "art_veto", False, 3.0)]
    [withdraw] = decisions_from_scores(cleared, trajectories, review, {("a", "veto"): flag.version})
    assert withdraw.action == "withdraw_trajectory"
    with pytest.raises(art.LangfuseConfigError, match="export itself writes"):
        LangfuseReview(reward_score="reward")
