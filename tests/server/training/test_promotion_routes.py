"""`/promote` and the train request's promotion fields over raw HTTP: what a gate asks of the
server, and its bad inputs refused with a message before anything moves."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.servers import RunningServer

MODELS = "/v1/training/models"


@pytest.fixture(scope="module")
def gated(server: RunningServer) -> str:
    body = {"project": "routes", "name": "gated", "base_model": "tiny"}
    response = httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["promoted_step"] == 0
    return f"{server.url}{MODELS}/routes/gated"


def sampled_trajectory(server: RunningServer, trajectory_id: str, reward: float) -> dict:
    """A trajectory with one real recorded turn, so a train step has tokens to train."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    completion = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    turns = [{"completion_id": completion["id"]}]
    return {"id": trajectory_id, "reward": reward, "histories": [{"turns": turns}]}


def train(server: RunningServer, url: str, **fields) -> dict:
    trajectories = [sampled_trajectory(server, f"t{i}", float(i)) for i in range(2)]
    body = {"groups": [{"trajectories": trajectories}], "config": {"learning_rate": 1e-3}}
    response = httpx.post(f"{url}/train", json={**body, **fields}, timeout=300)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line][-1]


def plain_name_step(server: RunningServer, name: str) -> str:
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["model"]


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"step": 99}, 404, "step", "no checkpoint for step 99; its checkpoints are [0"),
        ({"step": -1}, 400, "step", "greater than or equal to 0"),
        ({}, 400, "step", "required"),
        ({"step": 0, "metrics": {"gate/value": "x"}}, 400, "metrics.gate/value", "number"),
        ({"step": 0, "promote": "perhaps"}, 400, "promote", "boolean"),
        ({"step": 0, "stepp": 1}, 400, "stepp", "Unrecognized"),
        # Strict types: a boolean is no step 1, a 1 no promotion, a "1" no step.
        ({"step": True}, 400, "step", "valid integer"),
        ({"step": "1"}, 400, "step", "valid integer"),
        ({"step": 0, "promote": 1}, 400, "promote", "valid boolean"),
    ],
    ids=["unknown-step", "negative-step", "no-step", "metric-not-a-number", "promote-not-bool",
         "unknown-field", "step-true", "step-string", "promote-one"],
)  # fmt: skip
def test_bad_promote_requests_are_refused_naming_the_field(
    gated: str, body: dict, status: int, param: str, words: str
):
    response = httpx.post(f"{gated}/promote", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_non_finite_gate_metrics_are_refused(gated: str):
    content = '{"step": 0, "metrics": {"gate/value": NaN}}'
    response = httpx.post(
        f"{gated}/promote", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "finite" in response.json()["error"]["message"]


def test_promoting_a_model_that_is_not_registered_is_404(server: RunningServer):
    response = httpx.post(f"{server.url}{MODELS}/routes/ghost/promote", json={"step": 0})
    assert response.status_code == 404
    assert "register" in response.json()["error"]["message"]


def test_train_from_a_step_not_on_disk_is_400_before_anything_queues(
    server: RunningServer, gated: str
):
    trajectories = [{"id": "a", "reward": 1.0}, {"id": "b", "reward": 0.0}]
    body = {"groups": [{"trajectories": trajectories}], "train_from_step": 42}
    response = httpx.post(f"{gated}/train", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "train_from_step" and "no checkpoint for step 42" in error["message"]


def test_an_unpromoted_step_is_served_pinned_while_the_plain_name_stays(
    server: RunningServer, gated: str
):
    before = httpx.get(gated).json()
    step = before["step"] + 1
    result = train(server, gated, promote=False)
    assert result["step"] == step and result["promoted_step"] == before["promoted_step"]
    assert plain_name_step(server, "gated") == f"gated@{before['promoted_step']}"
    assert plain_name_step(server, f"gated@{step}") == f"gated@{step}"
    assert httpx.get(gated).json()["promoted_step"] == before["promoted_step"]

    refused = httpx.post(f"{gated}/promote", json={"step": step, "promote": False}, timeout=60)
    assert refused.status_code == 200 and refused.json()["promoted_step"] == before["promoted_step"]
    promoted = httpx.post(f"{gated}/promote", json={"step": step, "metrics": {"gate/value": 1}})
    assert promoted.status_code == 200 and promoted.json()["promoted_step"] == step
    assert plain_name_step(server, "gated") == f"gated@{step}"

    rows = [r for r in httpx.get(f"{gated}/history").json()["rows"] if r["type"] == "promotion"]
    assert [(r["step"], r["promoted"], r["promoted_step"]) for r in rows[-2:]] == [
        (step, False, before["promoted_step"]),
        (step, True, step),
    ]
    assert rows[-1]["metrics"] == {"gate/value": 1.0}


def test_the_promoted_step_is_never_deleted(server: RunningServer, gated: str):
    info = httpx.get(gated).json()
    if info["promoted_step"] == info["step"]:  # make the promoted step an older one
        train(server, gated, promote=False)
        info = httpx.get(gated).json()
    body = {"steps": [info["promoted_step"]]}
    response = httpx.post(f"{gated}/delete_checkpoints", json=body, timeout=60)
    assert response.status_code == 400
    assert "promoted step" in response.json()["error"]["message"]
    assert info["promoted_step"] in httpx.get(gated).json()["checkpoints"]
