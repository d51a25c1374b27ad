"""The training routes under hostile bodies and concurrent calls: large bodies are parsed and
long histories read off the event loop (so `/health` answers meanwhile), metrics and details are
bounded, and a promotion that arrives while a step trains waits for it, history intact."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import art_backend._limits as limits
import art_backend.store._checkpoints as checkpoints
import art_backend.training._routes as routes
from art_core.wire import MAX_DETAIL_CHARACTERS, MAX_DETAILS, MAX_METRIC_NAME, MAX_METRICS
from tests.support.servers import RunningServer

MODELS = "/v1/training/models"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def model_url(server: RunningServer) -> str:
    body = {"project": "limits", "name": "bounded", "base_model": "tiny"}
    response = httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return f"{server.url}{MODELS}/limits/bounded"


def trajectory(server: RunningServer, trajectory_id: str, reward: float) -> dict:
    """A trajectory with one real recorded turn, so a train step has tokens to train."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    completion = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    turns = [{"completion_id": completion["id"]}]
    return {"id": trajectory_id, "reward": reward, "histories": [{"turns": turns}]}


def train_body(server: RunningServer, **fields) -> dict:
    trajectories = [trajectory(server, f"t{i}", float(i)) for i in range(2)]
    return {"groups": [{"trajectories": trajectories}], "config": {"learning_rate": 1e-3}, **fields}


@pytest.fixture
def held(monkeypatch) -> Iterator[Callable[[Any, str], tuple[threading.Event, threading.Event]]]:
    """`hold(owner, name)`: replace `owner.name` with a version that, once called, waits until
    released; returns (called, release). Everything held is released after the test."""
    releases: list[threading.Event] = []

    def hold(owner: Any, name: str) -> tuple[threading.Event, threading.Event]:
        called, release = threading.Event(), threading.Event()
        original = getattr(owner, name)

        def waiting(*args: Any, **kwargs: Any) -> Any:
            called.set()
            release.wait(120)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, waiting)
        releases.append(release)
        return called, release

    yield hold
    for release in releases:
        release.set()


def assert_health_answers_while(called: threading.Event, server: RunningServer) -> None:
    """`called` is set (the held work began) and `/health` still answers: it could not if the
    held work ran on the event loop (it then times out, and the test fails)."""
    assert called.wait(60), "the held work never started"
    assert httpx.get(f"{server.url}/health", timeout=20).status_code == 200


# ------------------------------------------------------------------------------ event loop


def test_a_large_training_body_is_parsed_off_the_event_loop(server, model_url, held):
    # Whitespace is JSON: a small promotion in a body over the on-loop parsing size.
    body = b'{"step": 0' + b" " * (limits.PARSE_ON_LOOP_MAX_BYTES + 1) + b"}"
    called, release = held(limits, "parse_json_object")
    with ThreadPoolExecutor(1) as pool:
        promoted = pool.submit(httpx.post, f"{model_url}/promote", content=body, headers=JSON)
        try:
            assert_health_answers_while(called, server)
        finally:
            release.set()
        assert promoted.result(timeout=60).status_code == 200


def test_the_history_is_read_off_the_event_loop(server, model_url, held):
    expected = httpx.get(f"{model_url}/history").json()["rows"]
    called, release = held(checkpoints, "_rows_of")
    with ThreadPoolExecutor(1) as pool:
        history = pool.submit(httpx.get, f"{model_url}/history", timeout=60)
        try:
            assert_health_answers_while(called, server)
        finally:
            release.set()
        response = history.result(timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["rows"] == expected


@pytest.mark.parametrize("piece_bytes", [routes.HISTORY_PIECE_BYTES, 64], ids=["whole", "pieces"])
def test_the_history_route_serves_every_complete_row(server, model_url, monkeypatch, piece_bytes):
    """The rows' own lines, joined (read and sent in pieces when long): a damaged line in the
    middle and a torn last line (a crash mid-write) are skipped."""
    monkeypatch.setattr(routes, "HISTORY_PIECE_BYTES", piece_bytes)
    store = server.app.state.training.registry.get("limits", "bounded").store
    before = store.history_path.read_text()
    store.append_history({"type": "log", "step": 0, "split": "val", "metrics": {"m": 1.0}})
    with open(store.history_path, "a") as history:
        history.write('{"type": "damaged", "st\n')
    store.append_history({"type": "log", "step": 0, "split": "val", "metrics": {"m": 2.0}})
    with open(store.history_path, "a") as history:
        history.write('{"type": "torn", "st')
    try:
        rows = httpx.get(f"{model_url}/history").json()["rows"]
        assert rows == store.read_history() and rows
        assert [row["metrics"] for row in rows[-2:]] == [{"m": 1.0}, {"m": 2.0}]
        assert all(row.get("type") not in ("damaged", "torn") for row in rows)
    finally:
        store.history_path.write_text(before)


def test_the_value_bound_strips_strings_in_steps_as_a_whole_pass_would(monkeypatch):
    """Counted in steps that cut strings (and runs of escapes) apart, the values outside
    strings are the same as one pass over the whole body finds."""
    import random
    import re

    whole = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
    monkeypatch.setattr(limits, "SCAN_STEP_BYTES", 5)
    pieces = ["a", ",", "[", "{", '"', "\\", "\\\\", '\\"', "é", "\n"]
    generator = random.Random(7)

    def value(depth: int) -> Any:
        roll = generator.random()
        if depth > 3 or roll < 0.4:
            return "".join(generator.choice(pieces) for _ in range(generator.randint(0, 9)))
        if roll < 0.7:
            return [value(depth + 1) for _ in range(generator.randint(0, 4))]
        return {value(9): value(depth + 1) for _ in range(generator.randint(0, 4))}

    for _ in range(2_000):
        body = json.dumps({"x": value(0)}, ensure_ascii=generator.random() < 0.5).encode()
        outside = whole.sub(b'""', body)
        expected = 1 + outside.count(b",") + outside.count(b"[") + outside.count(b"{")
        assert limits._values_outside_strings(body) == expected, body


# ------------------------------------------------------------------------------ bounds


def metrics(count: int, name: str = "m") -> dict[str, float]:
    return {f"{name}{index}": 1.0 for index in range(count)}


@pytest.mark.parametrize(
    ("route", "body", "param", "words"),
    [
        ("promote", {"step": 0, "metrics": metrics(MAX_METRICS + 1)}, "metrics",
         f"more than the {MAX_METRICS:,}"),
        ("promote", {"step": 0, "metrics": {"n" * (MAX_METRIC_NAME + 1): 1.0}}, "metrics",
         f"more than the {MAX_METRIC_NAME}"),
        ("promote", {"step": 0, "details": {f"k{i}": 1 for i in range(MAX_DETAILS + 1)}},
         "details", f"more than the {MAX_DETAILS}"),
        ("promote", {"step": 0, "details": {"error": "e" * (MAX_DETAIL_CHARACTERS + 1)}},
         "details", f"more than the {MAX_DETAIL_CHARACTERS:,}"),
        ("promote", {"step": 0, "details": {"recorded_at": 0}}, "details",
         "recorded_at is a field of the promotion row itself"),
        ("promote", {"step": 0, "details": {"type": "x", "step": 9}}, "details",
         "step, type are fields of the promotion row itself"),
        ("log", {"metrics": metrics(MAX_METRICS + 1)}, "metrics", f"more than the {MAX_METRICS:,}"),
        ("train", {"groups": [], "client_metrics": metrics(50_000)}, "client_metrics",
         f"holds 50,000 metric names, more than the {MAX_METRICS:,}"),
        # Once a 400 naming no field, saying the body was no JSON object.
        ("delete_checkpoints", {"steps": [1], "maximize": True}, "maximize", "not both"),
    ],
    ids=["promote-metrics", "metric-name", "details-keys", "details-string", "recorded-at",
         "row-fields", "log-metrics", "client-metrics", "delete-both-forms"],
)  # fmt: skip
def test_metrics_and_details_are_bounded(model_url, route, body, param, words):
    response = httpx.post(f"{model_url}/{route}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_no_row_replaces_the_stores_recording_time(server, model_url):
    """Details cannot name it (refused above), and a row the server writes with one of its own
    still gets the store's time."""
    store = server.app.state.training.registry.get("limits", "bounded").store
    before = time.time()
    store.append_history({"type": "note", "recorded_at": 0})
    try:
        row = httpx.get(f"{model_url}/history").json()["rows"][-1]
        assert row["type"] == "note" and row["recorded_at"] >= before
    finally:
        text = store.history_path.read_text()
        store.history_path.write_text(text[: text.rstrip("\n").rindex("\n") + 1])


# ------------------------------------------------------------------- promote while training


def test_a_promotion_while_a_step_trains_waits_for_it(server, model_url, monkeypatch):
    """`promote` takes the step lock: it answers after the step commits, and the history holds
    the train row, then the promotion row, every line whole."""
    training = server.app.state.training
    release, started = threading.Event(), threading.Event()
    original = training.train

    async def held_train(*args: Any, **kwargs: Any) -> Any:
        started.set()
        await asyncio.to_thread(release.wait, 120)
        return await original(*args, **kwargs)

    monkeypatch.setattr(training, "train", held_train)
    body = train_body(server)
    try:
        with ThreadPoolExecutor(2) as pool:
            trained = pool.submit(httpx.post, f"{model_url}/train", json=body, timeout=300)
            assert started.wait(60)
            promoted = pool.submit(
                httpx.post, f"{model_url}/promote", json={"step": 0}, timeout=300
            )
            deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
            while not training._step_lock._waiters and time.monotonic() < deadline:
                time.sleep(0.01)
            assert training._step_lock._waiters and not promoted.done()  # it waits its turn
            release.set()
            train_response, promote_response = trained.result(), promoted.result()
    finally:
        release.set()
    assert train_response.status_code == 200 and promote_response.status_code == 200
    result = [json.loads(line) for line in train_response.text.splitlines()][-1]
    assert result["type"] == "result", result
    assert promote_response.json()["promoted_step"] == 0
    rows = httpx.get(f"{model_url}/history").json()["rows"]
    assert [(row["type"], row["step"]) for row in rows[-2:]] == [
        ("train", result["step"]),
        ("promotion", 0),
    ]
    assert rows[-1]["promoted_step"] == 0 and rows[-2]["promoted_step"] == result["step"]
