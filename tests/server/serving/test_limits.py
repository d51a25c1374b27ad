"""Size limits: one request cannot freeze the event loop or grow the server without bound.

Every refusal is an OpenAI-shaped 4xx that says which limit and what to do, and the server
keeps serving; what passes the limits is tokenized and compiled off the event loop.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from art_backend._limits import MAX_JSON_DEPTH, MAX_SCHEMA_NODES, MAX_SCHEMA_PROPERTIES
from art_backend.testing import InvalidGrammarError
from tests.support.servers import RunningServer, running_server

if TYPE_CHECKING:
    from art_backend.serving.chat._grammars import GrammarLane

USER = [{"role": "user", "content": "hi"}]
MIB = 1024 * 1024


def body(**fields) -> dict:
    return {"model": "tiny", "messages": USER, "max_tokens": 2, **fields}


def post(server: RunningServer, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=120, **kwargs)


def assert_error(response: httpx.Response, status: int, param: str | None, *words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"]


def assert_healthy(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert post(server, json=body()).status_code == 200


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def schema_with_properties(count: int, prefix: str = "p") -> dict:
    # All required: llguidance cannot start an object with hundreds of optional properties.
    properties = {f"{prefix}{i}": {"type": "string"} for i in range(count)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


# ------------------------------------------------------------------------------------- body


def test_a_body_over_the_limit_is_a_413_that_names_the_limit_and_the_option(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x" * (33 * MIB)}], max_tokens=2
        )
    assert raised.value.status_code == 413
    error = raised.value.body
    assert error["type"] == "invalid_request_error"
    assert "32 MiB" in error["message"] and "--max-body-mb" in error["message"]
    assert_healthy(server)


def test_a_chunked_body_is_counted_as_it_arrives(server):
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is found while reading
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(33):
            yield b"y" * MIB
        yield b'"}]}'

    response = post(server, content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, None, "32 MiB", "--max-body-mb")
    assert_healthy(server)


@pytest.fixture(scope="module")
def small_body_server(tiny_model_dir: Path, tmp_path_factory) -> Iterator[RunningServer]:
    """The tiny model served with `max_body_mb=0.5` (what `art-server --max-body-mb` passes)."""
    with running_server(
        tiny_model_dir, tmp_path_factory.mktemp("art-small-body"), max_body_mb=0.5
    ) as running:
        yield running


def test_max_body_mb_sets_the_limit(small_body_server):
    assert_error(post(small_body_server, json=body(user="n" * (MIB // 2))), 413, None, "0.5 MiB")
    assert post(small_body_server, json=body(user="short")).status_code == 200


# ------------------------------------------------------------------------------------ depth


def deep_request(field: str, value: str) -> str:
    """A request body as text: json.dumps itself cannot write JSON this deep."""
    return (
        '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
        f'"{field}": {value}}}'
    )


# Past 100,000 levels the body holds more values than any request may (`MAX_JSON_VALUES`).
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 10, 5_000, 90_000])
@pytest.mark.parametrize("field", ["tool_choice", "response_format"])
def test_json_nested_too_deep_is_a_400_naming_the_field(server, field, depth):
    # Up to ~1,000 levels the parser copes and the depth is counted; beyond, it gives up.
    value = f'{{"type": "json_object", "a": {nested(depth)}}}'
    response = post(server, content=deep_request(field, value))
    assert_error(response, 400, field, f"more than {MAX_JSON_DEPTH} levels")
    assert_healthy(server)


def test_json_nested_within_the_limit_is_served(server):
    shallow = {"type": "json_object", "a": [[[[[[[[[[]]]]]]]]]]}
    assert post(server, json=body(response_format=shallow)).status_code == 200
    deepest = deep_request(
        "response_format", f'{{"type": "json_object", "a": {nested(MAX_JSON_DEPTH - 2)}}}'
    )
    response = post(server, content=deepest)
    assert response.status_code == 200, response.text


# ----------------------------------------------------------------------------------- prompt


@pytest.mark.parametrize("stream", [False, True])
def test_a_message_longer_than_the_context_can_hold_is_refused_naming_messages(server, stream):
    # 8 MB: what froze every client for 12 s while it was tokenized on the event loop.
    messages = [{"role": "user", "content": "word " * (8 * MIB // 5)}]
    response = post(server, json=body(messages=messages, stream=stream))
    assert_error(response, 400, "messages", "characters", "context of 2048 tokens")
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert_healthy(server)


def test_tools_that_overflow_the_context_are_refused_naming_tools(server):
    description = "d" * 30_000
    tools = [{"type": "function", "function": {"name": "f", "description": description}}]
    assert_error(post(server, json=body(tools=tools)), 400, "tools", "Shorten the tools")


def test_tool_property_names_count_toward_the_context_too(server):
    """The template renders a schema's property names: long names once escaped the count."""
    properties = {"p" * 2_000 + str(index): {"type": "string"} for index in range(20)}
    parameters = {"type": "object", "properties": properties}
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    assert_error(post(server, json=body(tools=tools)), 400, "tools", "Shorten the tools")
    assert_healthy(server)


# ---------------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (schema_with_properties(MAX_SCHEMA_PROPERTIES + 1), "object properties"),
        ({"enum": list(range(MAX_SCHEMA_NODES))}, "JSON values"),
    ],
    ids=["properties", "nodes"],
)
def test_a_response_format_schema_too_large_to_compile_is_refused(server, schema, words):
    response = post(server, json=body(response_format=json_schema_format(schema)))
    assert_error(response, 400, "response_format.json_schema.schema", words, "Split the schema")
    assert_healthy(server)


def test_tool_schemas_are_counted_together_and_the_one_crossing_the_limit_is_named(server):
    # Checked in the real compiler: on the tiny model's 2k-token context, tools this large
    # overflow the prompt before their schemas are compiled.
    half = MAX_SCHEMA_PROPERTIES // 2 + 1
    tools = [
        {"type": "function", "function": {"name": "small", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "a", "parameters": schema_with_properties(half)}},
        {"type": "function", "function": {"name": "b", "parameters": schema_with_properties(half)}},
    ]
    compiler = server.service.grammar_compiler
    with pytest.raises(InvalidGrammarError, match="schemas to enforce") as raised:
        compiler.for_tool_choice(tools, "required", parallel_tool_calls=True)
    assert raised.value.param == "tools[2].function.parameters"
    named = {"type": "function", "function": {"name": "a"}}
    assert compiler.for_tool_choice(tools, named, parallel_tool_calls=True)  # one alone fits


# ------------------------------------------------------------------------------ event loop


def test_the_server_answers_while_a_large_schema_compiles(server):
    # The largest schema allowed, new to this server (compiled grammars are cached): compiling
    # it takes a while, and the server must answer others meanwhile. The compile is seen in
    # flight on /metrics, which can only answer then if the event loop is free.
    schema = schema_with_properties(MAX_SCHEMA_PROPERTIES, prefix=secrets.token_hex(4))
    slow: dict[str, httpx.Response] = {}
    request = threading.Thread(
        target=lambda: slow.update(
            response=post(server, json=body(response_format=json_schema_format(schema)))
        )
    )
    request.start()
    health_answered_while_compiling = False
    while request.is_alive() and not health_answered_while_compiling:
        compiling_before = server.metrics()["art_requests_preparing"] == 1
        health = httpx.get(f"{server.url}/health", timeout=120)
        compiling_after = server.metrics()["art_requests_preparing"] == 1
        health_answered_while_compiling = (
            compiling_before and compiling_after and health.status_code == 200
        )
    request.join()
    assert health_answered_while_compiling
    assert slow["response"].status_code == 200, slow["response"].text
    assert server.metrics()["art_requests_preparing"] == 0


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited a minute for {what}")
        time.sleep(0.01)


def test_a_small_chat_is_answered_while_large_schemas_compile(server):
    """Grammars compile in a lane of their own: a plain chat sent while the largest schemas
    allowed wait for it or compile is answered before any of them has left it (issue 49: on
    the shared preparing pool it waited 3.56 s behind four of them)."""
    # As many as the preparing pool has threads: there the chat waited for one to finish.
    schemas = [
        schema_with_properties(MAX_SCHEMA_PROPERTIES, prefix=secrets.token_hex(4))  # uncached
        for _ in range(min(4, os.cpu_count() or 1))
    ]
    compiles = server.metrics().get("art_grammar_compiles_total", 0.0)
    with ThreadPoolExecutor(len(schemas)) as pool:
        large = [
            pool.submit(post, server, json=body(response_format=json_schema_format(schema)))
            for schema in schemas
        ]
        until(lambda: server.service.preparing == len(schemas), "the schemas to arrive")
        small = post(server, json=body())
        assert small.status_code == 200, small.text
        assert server.service.preparing == len(schemas)  # none has finished compiling
        assert [request.result().status_code for request in large] == [200] * len(schemas)
    metrics = server.metrics()
    assert metrics["art_grammar_compiles_total"] == compiles + len(schemas)  # one each
    assert metrics["art_grammars_compiling"] == 0


def drained(lane: GrammarLane) -> None:
    """Return once every lane thread has finished what it took before this call."""
    barrier = threading.Barrier(lane.threads)
    for done in [lane._pool.submit(barrier.wait, 60) for _ in range(lane.threads)]:
        done.result()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_while_its_grammar_waits_compiles_nothing(server, stream):
    """A client that hangs up while its grammar waits for the lane leaves the queue: the
    request is let go while the lane is busy, and its grammar never compiles."""
    lane, held = server.service.grammars, threading.Event()
    blockers = [lane._pool.submit(held.wait, 120) for _ in range(lane.threads)]  # lane busy
    compiles = lane.compiles
    schema = schema_with_properties(3, prefix=secrets.token_hex(4))
    try:
        host, port = server.url.removeprefix("http://").split(":")
        payload = json.dumps(body(response_format=json_schema_format(schema), stream=stream))
        with socket.create_connection((host, int(port))) as client:
            client.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
                f"{payload}".encode()
            )
            until(lambda: server.service.preparing == 1, "the request to wait for the lane")
        # Let go while the lane is still busy: it left the queue.
        until(lambda: server.service.preparing == 0, "the request to be let go")
    finally:
        held.set()
        for blocker in blockers:
            blocker.result(timeout=30)
    drained(lane)
    assert lane.compiles == compiles


# ---------------------------------------------------------------------------------- records


def test_stored_records_are_counted_in_bytes_on_metrics(server):
    before = server.metrics()["art_records_bytes"]
    assert post(server, json=body(user="m" * 100_000)).status_code == 200
    assert server.metrics()["art_records_bytes"] >= before + 100_000


def test_small_requests_do_not_queue_behind_large_ones(server):
    """Requests that came in bodies over 1 MiB are prepared in a lane of their own: while that
    lane is held, a large request waits in it and a small one is served."""
    held = threading.Event()
    lane = server.service._large_workers
    blocker = lane.submit(held.wait, 120)  # the large lane is busy (a slow, large request)
    large_body = body(user="x" * 1_100_000)
    try:
        with ThreadPoolExecutor(1) as pool:
            large = pool.submit(post, server, json=large_body)
            deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
            while server.service.preparing < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.service.preparing == 1  # the large request waits for its lane
            small = post(server, json=body())
            assert small.status_code == 200, small.text
            assert not large.done()  # still waiting for the large lane
            held.set()
            assert large.result(timeout=120).status_code == 200
    finally:
        held.set()
        blocker.result(timeout=30)
