"""The training API over raw HTTP: bad requests are 4xx naming the field, before anything queues."""

from __future__ import annotations

import json
import math

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
        ({"groups": [group()], "config": {"loss": "reinforce"}}, "config.loss", "grpo"),
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


# ------------------------------------------------------------------- bad input that was a 500


def assert_still_serving(server: RunningServer) -> None:
    """A real completion succeeds: the request before it left the server healthy."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


def events_of(response: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line]


@pytest.fixture(scope="module")
def edge_model(server: RunningServer) -> str:
    """A model of its own, so the steps these tests train do not move r1's step."""
    body = {"project": "routes", "name": "edges", "base_model": "tiny"}
    response = httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return f"{server.url}{MODELS}/routes/edges"


def sampled_trajectory(server: RunningServer, trajectory_id: str, reward: float) -> dict:
    """A trajectory with one real recorded turn, so a train step has tokens to train."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    completion = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    turns = [{"completion_id": completion["id"]}]
    return {"id": trajectory_id, "reward": reward, "histories": [{"turns": turns}]}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"lora": {"target_modules": ["no_such_module"]}}, "lora.target_modules", "q_proj"),
        ({"seed": 2**70}, "seed", "less than or equal to 9223372036854775807"),
        ({"seed": -(2**63) - 1}, "seed", "greater than or equal to"),
        ({"lora": {"alpha": 1e308}}, "lora.alpha", "less than or equal to 1000000"),
        ({"lora": {"alpha": 1e-35, "r": 8}}, "lora", "too small to scale the adapter"),
        ({"lora": {"target_modules": []}}, "lora.target_modules", "at least 1 item"),
        ({"lora": {"target_modules": [""]}}, "lora.target_modules[0]", "at least 1 character"),
        ({"lora": {"r": 1024}}, "lora.r", "exceeds the width of the base model (hidden size"),
    ],
    ids=[
        "target-modules-naming-nothing",
        "seed-2**70",
        "seed-below-int64",
        "alpha-1e308",
        "alpha-over-r-underflows",
        "no-target-modules",
        "empty-target-module",
        "rank-past-the-width",
    ],
)
def test_bad_registration_is_a_400_that_saves_nothing(server: RunningServer, fields, param, words):
    body = {"project": "routes", "name": "refused", "base_model": "tiny", **fields}
    response = httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert words in response.json()["error"]["message"]
    assert httpx.get(f"{server.url}{MODELS}/routes/refused").status_code == 404
    assert not (server.art_path / "routes" / "models" / "refused").exists()
    assert_still_serving(server)


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        (
            [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "yo"}],
            "trajectories[0].messages[0]",
            "unknown role 'robot'",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {}}]},
            ],
            "trajectories[0].messages[1]",
            "text parts",
        ),
        (
            [{"role": "user"}, {"role": "assistant", "content": "yo"}],
            "trajectories[0].messages[0]",
            "needs `content`",
        ),
        ([], "trajectories[0].messages", "at least 1"),
    ],
    ids=["unknown-role", "image-part", "user-without-content", "no-messages"],
)
def test_bad_sft_examples_are_a_400_naming_the_message(
    server: RunningServer, edge_model: str, messages, param, words
):
    response = httpx.post(
        f"{edge_model}/sft", json={"trajectories": [{"messages": messages}]}, timeout=60
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert words in response.json()["error"]["message"]
    assert_still_serving(server)


def test_sft_trains_assistant_content_given_as_text_parts(server: RunningServer, edge_model: str):
    step = httpx.get(edge_model).json()["step"]
    parts = [{"type": "text", "text": "Paris"}, {"type": "text", "text": "is the capital."}]
    messages = [{"role": "user", "content": "capital?"}, {"role": "assistant", "content": parts}]
    response = httpx.post(
        f"{edge_model}/sft", json={"trajectories": [{"messages": messages}]}, timeout=120
    )
    assert response.status_code == 200
    result = events_of(response)[-1]
    assert result["type"] == "result", result
    assert result["step"] == step + 1
    assert_still_serving(server)


def test_rewards_near_the_float_limit_train_with_finite_statistics(
    server: RunningServer, edge_model: str
):
    rewards = [1e308, 1e308, 0.0]
    group = {
        "trajectories": [sampled_trajectory(server, f"t{i}", r) for i, r in enumerate(rewards)]
    }
    response = httpx.post(f"{edge_model}/train", json={"groups": [group]}, timeout=120)
    assert response.status_code == 200
    result = events_of(response)[-1]
    assert result["type"] == "result", result
    assert result["metrics"]["trained"] == 1.0
    assert result["metrics"]["reward"] == pytest.approx(1e308 / 3 * 2)
    assert all(math.isfinite(value) for value in result["metrics"].values())
    assert result["advantages"]["t2"] == pytest.approx(-2 / math.sqrt(3))
    assert_still_serving(server)


def test_rewards_too_large_to_train_unscaled_are_a_400(server: RunningServer, edge_model: str):
    group = {"trajectories": [{"id": "a", "reward": 1e300}, {"id": "b", "reward": 0.0}]}
    body = {"groups": [group], "config": {"scale_rewards": "none"}}
    response = httpx.post(f"{edge_model}/train", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "groups"
    assert "Rescale the rewards" in response.json()["error"]["message"]
    assert_still_serving(server)


def test_a_step_whose_gradient_overflows_is_refused_and_changes_nothing(
    server: RunningServer, edge_model: str
):
    step = httpx.get(edge_model).json()["step"]
    rewards = [1e30, 0.0]
    group = {
        "trajectories": [sampled_trajectory(server, f"g{i}", r) for i, r in enumerate(rewards)]
    }
    body = {"groups": [group], "config": {"scale_rewards": "none"}}
    response = httpx.post(f"{edge_model}/train", json=body, timeout=120)
    error = events_of(response)[-1]
    assert error["type"] == "error" and error["status"] == 400, error
    assert "gradient is not finite" in error["message"]
    assert httpx.get(edge_model).json()["step"] == step
    assert_still_serving(server)


def test_log_keeps_statistics_finite_and_counts_what_it_drops(
    server: RunningServer, edge_model: str
):
    groups = [
        {
            "trajectories": [
                {"id": "a", "reward": 1e308, "metrics": {"size": 1e308}},
                {"id": "b", "reward": 1e308, "metrics": {"size": 1e308}},
                {"id": "c", "reward": 0.0, "metrics": {"size": "Infinity"}},
            ],
            "metrics": {"calls": 1e308},
        },
        {"trajectories": [], "metrics": {"calls": 1e308}},
    ]
    # JSON has no infinity; Python's json module writes and reads it as a bare `Infinity`.
    content = json.dumps({"groups": groups}).replace('"Infinity"', "Infinity")
    response = httpx.post(
        f"{edge_model}/log", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    metrics = response.json()["metrics"]
    assert metrics["reward"] == pytest.approx(1e308 / 3 * 2)
    assert metrics["size"] == 1e308  # the infinite one left out of the mean...
    assert "calls" not in metrics  # ...and the sum that overflowed left out of the row,
    assert metrics["dropped/non_finite_metrics"] == 2  # both counted
    assert_still_serving(server)


def test_history_holding_a_lone_surrogate_on_disk_is_read_back_as_json(server: RunningServer):
    """A row logged before lone surrogates were refused: answered as a `\\ud800` escape (valid
    JSON, nothing lost), not a 500."""
    from art_backend.testing import ModelStore

    body = {"project": "routes", "name": "old-rows", "base_model": "tiny"}
    assert httpx.post(f"{server.url}{MODELS}", json=body, timeout=60).status_code == 200
    store = ModelStore(server.art_path, "routes", "old-rows")
    store.append_history({"type": "log", "split": "val", "step": 0, "metrics": {"m\ud800": 1.0}})

    response = httpx.get(f"{server.url}{MODELS}/routes/old-rows/history")

    assert response.status_code == 200, response.text
    assert "\\ud800" in response.text
    assert json.loads(response.text)["rows"][-1]["metrics"] == {"m\ud800": 1.0}


def test_a_turn_whose_record_was_evicted_is_dropped_saying_why(
    server: RunningServer, edge_model: str
):
    trajectories = [
        sampled_trajectory(server, f"e{i}", reward) for i, reward in enumerate([1, 0, 0.5])
    ]
    evicted_id = trajectories[0]["histories"][0]["turns"][0]["completion_id"]
    records = server.service.records
    # As if it had come two hours ago: the oldest record, past its hour.
    aged = records._records.pop(evicted_id)
    aged["recorded_at"] -= 2 * records.ttl_seconds
    records._records = {evicted_id: aged, **records._records}
    assert records.get(evicted_id) is None

    response = httpx.post(
        f"{edge_model}/train", json={"groups": [{"trajectories": trajectories}]}, timeout=120
    )

    result = events_of(response)[-1]
    assert result["type"] == "result", result
    assert result["metrics"]["dropped/evicted_completion"] == 1.0
    assert result["metrics"]["dropped/unknown_completion"] == 0.0
    assert any("evicted before this step (1 older than 3600 s)" in w for w in result["warnings"])


@pytest.mark.parametrize(
    ("content", "content_type"),
    [(b"", "application/json"), (b'{"project": "p"}', "text/plain"), (b"null", "application/json")],
    ids=["no-body", "text-plain", "null"],
)
def test_a_register_without_a_json_object_body_says_so(
    server: RunningServer, content: bytes, content_type: str
):
    response = httpx.post(
        f"{server.url}{MODELS}", content=content, headers={"content-type": content_type}
    )
    assert response.status_code == 400, response.text
    assert "must be a JSON object" in response.json()["error"]["message"]
