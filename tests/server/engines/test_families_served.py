"""Families through the whole server, on the engine the suite runs (`make test`: torch;
`make test-vllm`: vLLM's CPU build): chat requests of different lengths at once answer with the
tokens transformers' `generate()` gives each alone, and a GRPO step on them trains with a ratio
of 1. The families are those vLLM's CPU build serves; the torch engine's own matrix (every
family, batches merged mid-decode) is test_architectures.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoTokenizer

import art_core as art
from art_backend.engines._vllm_options import VllmOptions
from tests.support.adapters import load_model
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer, running_server
from tests.support.tiny_families import FAMILIES, Family, build_family_model
from tests.support.tiny_model import VLLM_SHAPE

SERVED = [family for family in FAMILIES if family.name in ("qwen2", "qwen3", "gemma3", "mistral")]
QUESTIONS = ["Hi", "What is the capital of France? " * 3, "1 2 3 4 5 6 7 8 9 " * 4]


@pytest.fixture(scope="module", params=SERVED, ids=str)
def family_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, test_engine: str
) -> Iterator[tuple[Path, RunningServer]]:
    family: Family = request.param
    folder = tmp_path_factory.mktemp(family.name)
    # vLLM's CPU attention takes head sizes of 32 and up.
    build_family_model(family, folder / "model", shape=VLLM_SHAPE, head_dim=64)
    options: dict = {"engine": test_engine}
    if test_engine == "vllm":
        options["vllm"] = VllmOptions(kv_cache_gb=1)
    with running_server(folder / "model", folder / "art", **options) as server:
        yield folder / "model", server


async def test_concurrent_chat_requests_answer_as_generate_does_alone(family_server):
    folder, server = family_server
    tokenizer = AutoTokenizer.from_pretrained(folder)
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:

        async def ask(question: str, max_tokens: int) -> tuple[list[int], list[int]]:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": question}],
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
            answer = (await client.post("/v1/chat/completions", json=body)).json()
            record = (await client.get(f"/v1/chat/completions/{answer['id']}")).json()
            return record["prompt_token_ids"], record["choices"][0]["token_ids"]

        results = await asyncio.gather(
            *(ask(question, 6 + 5 * index) for index, question in enumerate(QUESTIONS))
        )
    reference = load_model(folder)
    for index, (prompt_ids, token_ids) in enumerate(results):
        output = reference.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=6 + 5 * index,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        )
        assert token_ids == output[0, len(prompt_ids) :].tolist(), index


async def test_a_grpo_step_on_served_samples_trains_with_a_ratio_of_one(family_server):
    folder, server = family_server
    backend = art.RemoteBackend(server.url)
    try:
        model = await fresh_model(backend, folder)
        groups = varied_group(await groups_for(model, QUESTIONS[:2], max_tokens=12))
        result = await backend.train(model, groups, learning_rate=1e-4)
    finally:
        await backend.close()
    assert result.step == 1
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
