"""Engine replicas on vLLM, for real: one server in front of two vLLM CPU servers (make test-vllm).

`art-server --engine vllm --vllm-url A --vllm-url B`: a rollout's turns land on one vLLM, new
rollouts spread, a trained step is loaded into both, and a vLLM killed under the server is taken
out (its /health stops answering) while the other serves on, sticky rollouts included. Records
are complete whichever vLLM answered. Replica 0 is the session's shared vLLM; replica 1 is this
module's own, the one killed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import art_core as art
from art_backend.engines._replicas import ReplicaSet
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer, running_server

# Two vLLM servers start under the first test (1-3 minutes each on a busy 2-core machine).
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def second_vllm(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A second vLLM server on the tiny model: this module's own, so that it may be killed."""
    from art_backend.testing import VllmProcess, VllmSettings, find_vllm_python

    python = find_vllm_python()
    if python is None:
        pytest.fail("--engine vllm needs ART_VLLM_PYTHON (make test-vllm sets it)")
    process = VllmProcess(
        VllmSettings(
            python=python,
            model=str(tiny_model_dir),
            dtype="float32",
            context_length=2048,
            kv_cache_gb=1,
            log_path=tmp_path_factory.mktemp("vllm-2") / "vllm.log",
        )
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def replicated(
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_url: str,
    second_vllm: Any,
) -> Iterator[RunningServer]:
    from art_backend.engines._vllm_options import VllmOptions

    vllm = VllmOptions(url=vllm_url, replica_urls=[second_vllm.base_url])
    path = tmp_path_factory.mktemp("art-vllm-replicas")
    with running_server(tiny_model_dir, path, engine="vllm", vllm=vllm) as running:
        yield running


def routed(server: RunningServer) -> list[int]:
    replicas = httpx.get(f"{server.url}/health").json()["replicas"]
    return [replica["requests_routed"] for replica in replicas]


def turn(server: RunningServer, rollout_id: str, messages: list[dict], **options: Any) -> int:
    """One more turn of a rollout; returns the replica that answered it."""
    client = openai.OpenAI(
        base_url=f"{server.url}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=0
    )
    before = routed(server)
    response = client.chat.completions.create(
        model=options.pop("model", "tiny"),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=options.pop("max_tokens", 6),
        **options,
    )
    messages += [
        {"role": "assistant", "content": response.choices[0].message.content or ""},
        {"role": "user", "content": "And then?"},
    ]
    grown = [i for i, (a, b) in enumerate(zip(before, routed(server), strict=True)) if b > a]
    assert len(grown) == 1, grown
    return grown[0]


def test_two_vllm_replicas_behind_one_server(replicated: RunningServer):
    health = httpx.get(f"{replicated.url}/health").json()
    assert health["status"] == "ok" and health["engine"] == "vllm"
    assert [r["up"] for r in health["replicas"]] == [True, True]
    first = []
    for _ in range(2):
        rollout_id = f"v-{uuid.uuid4().hex[:8]}"
        messages = [{"role": "user", "content": "Tell me a story."}]
        replicas = [turn(replicated, rollout_id, messages) for _ in range(3)]
        assert len(set(replicas)) == 1, replicas
        first.append(replicas[0])
        records = httpx.get(f"{replicated.url}/v1/rollouts/{rollout_id}").json()["completions"]
        assert len(records) == 3
        assert all(r["prompt_token_ids"] and r["choices"][0]["token_ids"] for r in records)
    assert sorted(first) == [0, 1]


async def test_a_trained_step_is_loaded_into_both_vllms(
    replicated: RunningServer, tiny_model_dir: Path
):
    backend = art.RemoteBackend(replicated.url)
    try:
        model = await fresh_model(backend, tiny_model_dir)
        groups = varied_group(await groups_for(model, ["one", "two", "three"], per_group=4))
        await model.train(groups, config=art.TrainConfig(learning_rate=5e-2))
    finally:
        await backend.close()
    engines = replicated.service.engine
    assert isinstance(engines, ReplicaSet)
    step = model.get_inference_name(1)
    assert step in engines.adapters
    for replica in engines.replicas:
        assert sorted(replica.engine.adapters) == sorted(engines.adapters)
        served = httpx.get(f"{replica.engine.process.base_url}/v1/models").json()["data"]
        assert any(entry["id"].endswith(step) for entry in served)
    greedy: dict[int, str] = {}
    for _ in range(4):
        messages = [{"role": "user", "content": "Say something."}]
        replica = turn(replicated, f"g-{uuid.uuid4().hex[:8]}", messages, model=step, temperature=0)
        greedy[replica] = messages[1]["content"]
    assert sorted(greedy) == [0, 1] and greedy[0] == greedy[1]


def test_a_killed_vllm_is_taken_out_and_routed_around(replicated: RunningServer, second_vllm: Any):
    rollout_id = ""
    messages: list[dict] = []
    for _ in range(4):  # a rollout on replica 1, the one to be killed
        rollout_id = f"k-{uuid.uuid4().hex[:8]}"
        messages = [{"role": "user", "content": "Tell me a long story."}]
        if turn(replicated, rollout_id, messages) == 1:
            break
    else:
        pytest.fail("no new rollout went to replica 1")
    client = openai.OpenAI(
        base_url=f"{replicated.url}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=0
    )
    no_end = {str(replicated.service.engine.tokenizer.eos_token_id): -100}  # it runs on
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=1500,
        logit_bias=no_end,
        stream=True,
    )
    next(iter(stream))
    os.killpg(second_vllm.process.pid, signal.SIGKILL)
    with pytest.raises(openai.APIError):
        for _ in stream:  # the stream breaks: its request fails, it does not hang
            pass
    deadline = time.monotonic() + 120
    while httpx.get(f"{replicated.url}/health").json()["replicas"][1]["up"]:
        assert time.monotonic() < deadline, "the killed vLLM was never taken out"
        time.sleep(0.2)
    health = httpx.get(f"{replicated.url}/health").json()
    assert health["status"] == "ok" and "does not answer" in health["replicas"][1]["error"]
    assert turn(replicated, rollout_id, messages) == 0  # the sticky rollout moved on
    for _ in range(2):
        assert (
            turn(replicated, f"n-{uuid.uuid4().hex[:8]}", [{"role": "user", "content": "Hi"}]) == 0
        )
    records = httpx.get(f"{replicated.url}/v1/rollouts/{rollout_id}").json()["completions"]
    assert len(records) == 2  # the first turn (replica 1) and the last (replica 0)
