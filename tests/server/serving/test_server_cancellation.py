"""A client that goes away frees its rows: the engine stops generating for it; one that stops
reading without going away holds neither rows nor its stream past a bound."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import httpx
import pytest

from art_backend.serving import _answer
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


def stalled_reader(server: RunningServer, body: dict) -> socket.socket:
    """A real streaming client that sends `body`, then reads nothing and does not hang up (a
    small receive buffer, so the server's sends soon have to wait for it)."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def test_a_stream_whose_reader_stops_reading_is_dropped_and_holds_no_rows(server, monkeypatch):
    """The engine runs a stalled reader's rows to their end and frees them; its stream, more
    than the sockets can buffer (four long choices with 20 logprobs a token), is dropped once a
    send has waited `STALLED_STREAM_SECONDS`, counted, and the connection is closed."""
    monkeypatch.setattr(_answer, "STALLED_STREAM_SECONDS", 1.0)
    before = server.metrics()
    body = long_request(stream=True, n=4, logprobs=True, top_logprobs=20)
    with contextlib.closing(stalled_reader(server, body)) as sock:
        deadline = time.monotonic() + 120  # a bound on the wait, not a timing assertion
        while time.monotonic() < deadline:
            metrics = server.metrics()
            dropped = metrics["art_streams_stalled_total"] > before["art_streams_stalled_total"]
            if dropped and metrics["art_running_rows"] == 0:
                break
            time.sleep(0.2)
        else:
            pytest.fail("a stream nobody read was held past its stall bound")
        assert httpx.get(f"{server.url}/health").status_code == 200
        # What the sockets held still arrives, then the end: the stream never finished.
        sock.settimeout(60)
        received = b"".join(iter(lambda: sock.recv(1 << 16), b""))
    assert received.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in received
