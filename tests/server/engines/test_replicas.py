"""Engine replicas: one server in front of two torch engines (`art-server --replicas 2`).

A rollout's turns land on one replica, new rollouts spread over both, a trained step is served
by both, a refused adapter is served by neither, and a replica that dies is taken out: its
request in flight fails naming it, and everything after (its sticky rollout too) runs on the
other. Every completion is recorded whichever replica answered it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import art_core as art
from art_backend.engines._replicas import ReplicaSet
from art_backend.testing import InvalidRequestError
from tests.support.adapters import make_random_adapter
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer, running_server

pytestmark = pytest.mark.torch_engine


@pytest.fixture(scope="module")
def replicated(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("art-replicas")
    with running_server(tiny_model_dir, path, replicas=2) as running:
        yield running


def replica_set(server: RunningServer) -> ReplicaSet:
    engine = server.service.engine
    assert isinstance(engine, ReplicaSet)
    return engine


def routed(server: RunningServer) -> list[int]:
    """Requests routed to each replica so far, as /health reports them."""
    replicas = httpx.get(f"{server.url}/health").json()["replicas"]
    return [replica["requests_routed"] for replica in replicas]


def served_by(server: RunningServer, call: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    """Which replica answered `call(*args)` (one request, nothing else running), and its answer."""
    before = routed(server)
    answer = call(*args)
    grown = [i for i, (a, b) in enumerate(zip(before, routed(server), strict=True)) if b > a]
    assert len(grown) == 1, (before, routed(server))
    return grown[0], answer


def rollout_client(server: RunningServer, rollout_id: str) -> openai.OpenAI:
    base_url = f"{server.url}/rollouts/{rollout_id}/v1"
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def turn(client: openai.OpenAI, messages: list[dict], **options: Any) -> str:
    """One more turn of a conversation: ask, append the answer, return it."""
    response = client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=options.pop("max_tokens", 6),
        **options,
    )
    text = response.choices[0].message.content or ""
    messages.append({"role": "assistant", "content": text})
    messages.append({"role": "user", "content": "And then?"})
    return text


def test_health_and_metrics_show_each_replica(replicated: RunningServer):
    health = httpx.get(f"{replicated.url}/health").json()
    assert health["status"] == "ok" and health["engine"] == "torch"
    assert [(r["replica"], r["up"]) for r in health["replicas"]] == [(0, True), (1, True)]
    metrics = replicated.metrics()
    assert metrics['art_replica_up{replica="0"}'] == metrics['art_replica_up{replica="1"}'] == 1


def test_a_rollouts_turns_stay_on_one_replica_and_new_rollouts_spread(replicated: RunningServer):
    first_replicas = []
    for _ in range(4):
        rollout_id = f"sticky-{uuid.uuid4().hex[:8]}"
        client = rollout_client(replicated, rollout_id)
        messages = [{"role": "user", "content": "Tell me a story."}]
        replicas = [served_by(replicated, turn, client, messages)[0] for _ in range(3)]
        assert len(set(replicas)) == 1, f"{rollout_id} moved between replicas: {replicas}"
        first_replicas.append(replicas[0])
        records = httpx.get(f"{replicated.url}/v1/rollouts/{rollout_id}").json()["completions"]
        assert len(records) == 3
    assert set(first_replicas) == {0, 1}, first_replicas  # one after another: they alternate
    metrics = replicated.metrics()
    assert metrics["art_replica_follow_up_same_replica_total"] >= 8
    assert metrics["art_replica_reusable_prefix_tokens_total"] > 0


async def test_concurrent_rollouts_spread_and_every_turn_is_recorded(replicated: RunningServer):
    before = routed(replicated)
    rollout_ids = [f"spread-{uuid.uuid4().hex[:8]}" for _ in range(8)]

    async def rollout(rollout_id: str) -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{replicated.url}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=0
        )
        messages: list[dict] = [{"role": "user", "content": f"Count to {len(rollout_id)}."}]
        for _ in range(2):
            response = await client.chat.completions.create(
                model="tiny",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=24,
                logprobs=True,
            )
            messages += [
                {"role": "assistant", "content": response.choices[0].message.content or ""},
                {"role": "user", "content": "Go on."},
            ]
        await client.close()

    await asyncio.gather(*(rollout(rollout_id) for rollout_id in rollout_ids))
    grown = [b - a for a, b in zip(before, routed(replicated), strict=True)]
    assert sum(grown) == 16 and min(grown) >= 4, grown  # least in flight: both took rollouts
    for rollout_id in rollout_ids:
        records = httpx.get(f"{replicated.url}/v1/rollouts/{rollout_id}").json()["completions"]
        assert len(records) == 2
        for record in records:
            choice = record["choices"][0]
            assert record["prompt_token_ids"] and choice["token_ids"]
            assert len(choice["token_ids"]) == len(choice["logprobs"])


async def test_a_trained_step_is_served_by_both_replicas(
    replicated: RunningServer, tiny_model_dir: Path
):
    backend = art.RemoteBackend(replicated.url)
    try:
        model = await fresh_model(backend, tiny_model_dir)
        groups = varied_group(await groups_for(model, ["one", "two", "three"], per_group=4))
        await model.train(groups, config=art.TrainConfig(learning_rate=5e-2))
        assert await model.get_step() == 1
    finally:
        await backend.close()
    engines = replica_set(replicated)
    step = model.get_inference_name(1)
    assert step in engines.adapters
    for replica in engines.replicas:  # new steps loaded, old ones unloaded: on every replica
        assert sorted(replica.engine.adapters) == sorted(engines.adapters)

    def greedy() -> tuple[str, list[float]]:
        response = httpx.post(
            f"{replicated.url}/v1/chat/completions",
            json={
                "model": step,
                "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": 12,
                "temperature": 0,
                "logprobs": True,
            },
            timeout=60,
        ).json()
        choice = response["choices"][0]
        return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]

    answers: dict[int, tuple[str, list[float]]] = {}
    for _ in range(6):  # new requests without a rollout alternate between the replicas
        replica, answer = served_by(replicated, greedy)
        answers[replica] = answer
        if len(answers) == 2:
            break
    assert set(answers) == {0, 1}
    assert answers[0][0] == answers[1][0]  # the same weights on both
    assert max(abs(a - b) for a, b in zip(answers[0][1], answers[1][1], strict=True)) < 1e-4


def test_an_adapter_one_replica_refuses_is_served_by_none(
    replicated: RunningServer, tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    engines = replica_set(replicated)
    folder = make_random_adapter(tiny_model_dir, tmp_path / "adapter", seed=3)

    def refuse(served_name: str, path: Path) -> None:
        raise InvalidRequestError(f"replica 1 cannot load adapter {served_name!r}")

    monkeypatch.setattr(engines.replicas[1].engine, "load_adapter", refuse)
    with pytest.raises(InvalidRequestError, match="replica 1 cannot load"):
        engines.load_adapter("half@1", folder)
    assert "half@1" not in engines.adapters
    assert all("half@1" not in replica.engine.adapters for replica in engines.replicas)
    monkeypatch.undo()
    engines.load_adapter("whole@1", folder)  # both load it: served
    assert all("whole@1" in replica.engine.adapters for replica in engines.replicas)
    engines.unload_adapter("whole@1")
    assert all("whole@1" not in replica.engine.adapters for replica in engines.replicas)


# The engine thread dies of the SystemExit below, as a crashed one would: pytest reports it.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_replica_that_dies_is_taken_out_and_routed_around(tiny_model_dir: Path, tmp_path: Path):
    with running_server(tiny_model_dir, tmp_path, replicas=2) as server:
        engines = replica_set(server)
        engines.health_interval = 0.1
        rollout_id = f"doomed-{uuid.uuid4().hex[:8]}"
        client = rollout_client(server, rollout_id)
        messages = [{"role": "user", "content": "Tell me a long story."}]
        doomed, _ = served_by(server, turn, client, messages)

        def die(*_: object) -> None:
            raise SystemExit  # the engine thread ends at its next decode step

        engines.replicas[doomed].engine._decode_step = die  # type: ignore[attr-defined]
        with pytest.raises(
            openai.InternalServerError, match=f"engine replica {doomed} was taken"
        ) as failed:
            turn(client, messages, max_tokens=40)  # sticky: lands on the doomed replica
        assert failed.value.status_code == 503  # the replica went away, not a bug: retry it

        health = httpx.get(f"{server.url}/health").json()
        assert health["status"] == "ok"
        states = {r["replica"]: r for r in health["replicas"]}
        assert not states[doomed]["up"] and "thread has stopped" in states[doomed]["error"]
        assert states[doomed]["requests_failed_by_takeout"] == 1
        survivor = 1 - doomed
        replica, _ = served_by(server, turn, client, messages)
        assert replica == survivor  # the sticky rollout moved on
        for _ in range(3):
            fresh = rollout_client(server, f"after-{uuid.uuid4().hex[:8]}")
            replica, _ = served_by(server, turn, fresh, [{"role": "user", "content": "Hi"}])
            assert replica == survivor
        records = httpx.get(f"{server.url}/v1/rollouts/{rollout_id}").json()["completions"]
        assert len(records) == 2  # the turns that were answered, one on each replica
        metrics = server.metrics()
        assert metrics[f'art_replica_up{{replica="{doomed}"}}'] == 0
        assert metrics["art_requests_failed_total"] >= 1


def test_the_last_replica_out_fails_the_server(tiny_model_dir: Path, tmp_path: Path):
    with running_server(tiny_model_dir, tmp_path, replicas=2) as server:
        engines = replica_set(server)
        for index in range(2):
            engines._take_out(index, f"replica {index} stopped for this test")
        response = httpx.get(f"{server.url}/health")
        assert response.status_code == 503 and "every engine replica" in response.json()["error"]
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
        assert refused.value.status_code == 503


def test_replicas_flags_are_checked_before_anything_loads():
    from art_backend.engines._replica_setup import replica_count
    from art_backend.engines._vllm_options import VllmOptions

    assert replica_count(2, "torch", VllmOptions()) == 2
    assert replica_count(1, "vllm", VllmOptions(url="a", replica_urls=["b"])) == 2
    with pytest.raises(InvalidRequestError, match="data-parallel-size"):
        replica_count(2, "vllm", VllmOptions())
    with pytest.raises(InvalidRequestError, match="--engine vllm"):
        replica_count(1, "torch", VllmOptions(url="a", replica_urls=["b"]))
