"""Slow: the real SmolLM2-135M-Instruct, loaded offline from its PyPI package, served over HTTP."""

from __future__ import annotations

import openai
import pytest

from tests.support.servers import start_server

pytestmark = pytest.mark.slow


def test_smollm2_answers_paris_through_the_server(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    uv_server, thread, running = start_server(
        "smollm2-135m-instruct", tmp_path, name="smollm2", dtype="auto"
    )
    try:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=30,
            temperature=0,
        )
        assert "Paris" in reply.choices[0].message.content
    finally:
        uv_server.should_exit = True
        thread.join(30)
