"""LoRA checkpoints served as `name@step` beside the base model, over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.adapters import make_random_adapter
from tests.support.servers import start_server

QUESTION = [{"role": "user", "content": "which adapter answers?"}]


@pytest.fixture(scope="module")
def adapter_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    art_path = tmp_path_factory.mktemp("art-adapters")
    checkpoints = art_path / "demo" / "models" / "agent" / "checkpoints"
    make_random_adapter(tiny_model_dir, checkpoints / "0001", seed=1)
    make_random_adapter(tiny_model_dir, checkpoints / "0002", seed=2)
    uv_server, thread, running = start_server(tiny_model_dir, art_path)
    yield running
    uv_server.should_exit = True
    thread.join(10)


def greedy_ids(client: openai.OpenAI, model: str) -> list[int]:
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=8, temperature=0
    )
    return reply.choices[0].model_extra["token_ids"]


def test_checkpoints_under_path_are_served_at_startup(adapter_server):
    client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    assert [model.id for model in client.models.list()] == ["tiny", "agent@1", "agent@2"]


def test_each_step_answers_with_its_own_weights(adapter_server):
    client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    outputs = {model: greedy_ids(client, model) for model in ("tiny", "agent@1", "agent@2")}
    assert outputs["tiny"] != outputs["agent@1"] != outputs["agent@2"]


async def test_steps_mixed_in_one_batch_match_their_solo_outputs(adapter_server):
    sync_client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    models = ["tiny", "agent@1", "agent@2"] * 3
    solo = {model: greedy_ids(sync_client, model) for model in set(models)}
    client = openai.AsyncOpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=model, messages=QUESTION, max_tokens=8, temperature=0
            )
            for model in models
        )
    )
    for model, reply in zip(models, replies, strict=True):
        assert reply.choices[0].model_extra["token_ids"] == solo[model]


def test_a_new_checkpoint_is_loaded_on_request(adapter_server, tiny_model_dir):
    folder = adapter_server.art_path / "demo" / "models" / "agent" / "checkpoints" / "0003"
    make_random_adapter(tiny_model_dir, folder, seed=3)
    response = httpx.post(
        f"{adapter_server.url}/v1/adapters", json={"name": "agent@3", "path": str(folder)}
    )
    assert response.status_code == 200, response.text
    client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    assert "agent@3" in [model.id for model in client.models.list()]
    assert len(greedy_ids(client, "agent@3")) == 8


def test_missing_adapter_folder_is_a_400(adapter_server):
    folder = adapter_server.art_path / "demo" / "models" / "agent" / "checkpoints" / "0009"
    response = httpx.post(
        f"{adapter_server.url}/v1/adapters", json={"name": "agent@9", "path": str(folder)}
    )
    assert response.status_code == 400
    assert "adapter_config.json" in response.json()["error"]["message"]
