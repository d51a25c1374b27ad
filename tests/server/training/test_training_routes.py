"""The training API over raw HTTP: bad requests are 4xx naming the field, before anything queues."""

from __future__ import annotations

import httpx
import pytest

from tests.support.servers import RunningServer

MODELS = "/v1/training/models"


@pytest.fixture(scope="module")
def registered(server: RunningServer) -> str:
    body = {"project": "routes", "name": "r1", "base_model": "tiny"}
    response = httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["step"] == 0 and response.json()["inference_name"] == "r1@0"
    return f"{server.url}{MODELS}/routes/r1"


def group(reward: object = 1.0) -> dict:
    return {"trajectories": [{"id": "a", "reward": reward}, {"id": "b", "reward": 0.0}]}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"groups": [group()], "config": {"learning_rat": 1}},
            "config.learning_rat",
            "Unrecognized",
        ),
        (
            {"groups": [group()], "config": {"learning_rate": -1}},
            "config.learning_rate",
            "greater than 0",
        ),
        ({"groups": [group()], "config": {"loss": "ppo"}}, "config.loss", "grpo"),
        ({"groups": [group("x")]}, "groups[0].trajectories[0].reward", "number"),
        ({"groups": "nope"}, "groups", "list"),
    ],
    ids=[
        "unknown-option",
        "negative-lr",
        "unknown-loss",
        "reward-not-a-number",
        "groups-not-a-list",
    ],
)
def test_bad_train_requests_are_400_naming_the_field(registered: str, body, param, message):
    response = httpx.post(f"{registered}/train", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"]


def test_infinite_reward_is_refused(registered: str):
    content = '{"groups": [{"trajectories": [{"id": "a", "reward": Infinity}, {"id": "b", "reward": 0}]}]}'
    response = httpx.post(
        f"{registered}/train", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "finite" in response.json()["error"]["message"]


def test_unregistered_model_is_404_saying_what_to_do(server: RunningServer):
    response = httpx.post(f"{server.url}{MODELS}/routes/ghost/train", json={"groups": [group()]})
    assert response.status_code == 404
    assert "register" in response.json()["error"]["message"]


@pytest.mark.parametrize("name", ["../evil", "a/b", "", "x" * 101, ".hidden"])
def test_unsafe_model_names_are_refused(server: RunningServer, name: str):
    body = {"project": "routes", "name": name, "base_model": "tiny"}
    response = httpx.post(f"{server.url}{MODELS}", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "name"


def test_fork_from_a_missing_checkpoint_is_400(server: RunningServer, registered: str):
    body = {
        "project": "routes", "name": "r2", "base_model": "tiny",
        "fork_from": {"project": "routes", "name": "r1", "step": 7},
    }  # fmt: skip
    response = httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)
    assert response.status_code == 400
    assert "available checkpoints [0]" in response.json()["error"]["message"]


def test_nothing_trainable_is_a_result_with_reasons(registered: str):
    body = {"groups": [group(1.0) | {"trajectories": [{"id": "a", "reward": 1.0}]}]}
    response = httpx.post(f"{registered}/train", json=body, timeout=60)
    assert response.status_code == 200
    events = [line for line in response.text.splitlines() if line]
    assert '"type": "result"' in events[-1]
    assert "groups/too_small" in events[-1] and '"step": 0' in events[-1]
