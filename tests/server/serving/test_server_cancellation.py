"""A client that goes away frees its rows: the engine stops generating for it."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.servers import RunningServer

EOS_ID = 2  # <|im_end|> in the tiny tokenizer: banned so the generation would run long


def long_request(**extra) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "go on forever"}],
        "max_tokens": 1800,
        "logit_bias": {str(EOS_ID): -100},
        **extra,
    }


def wait_for_cancellation(server: RunningServer, before: float) -> dict[str, float]:
    deadline = time.monotonic() + 60  # a bound on the wait, not a performance assertion
    while time.monotonic() < deadline:
        metrics = server.metrics()
        if metrics["art_requests_cancelled_total"] > before and metrics["art_running_rows"] == 0:
            return metrics
        time.sleep(0.1)
    pytest.fail("the engine kept generating for a client that had gone away")


# vLLM can finish the tiny model's 1800 tokens before a loaded 2-core machine notices the
# disconnect; the streaming test below covers cancellation on both engines.
@pytest.mark.torch_engine
@pytest.mark.parametrize("server_fixture", ["server", "keyed_server"])
def test_non_streaming_client_that_times_out_is_cancelled(server_fixture, request):
    server = request.getfixturevalue(server_fixture)  # with and without the auth middleware
    before = server.metrics()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/chat/completions",
            json=long_request(),
            headers=server.headers(),
            timeout=0.2,
        )
    after = wait_for_cancellation(server, before["art_requests_cancelled_total"])
    generated = after["art_generated_tokens_total"] - before["art_generated_tokens_total"]
    assert generated < 1800


def test_streaming_client_that_closes_is_cancelled(server):
    before = server.metrics()
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=long_request(stream=True), timeout=30
    ) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    after = wait_for_cancellation(server, before["art_requests_cancelled_total"])
    generated = after["art_generated_tokens_total"] - before["art_generated_tokens_total"]
    assert generated < 1800
