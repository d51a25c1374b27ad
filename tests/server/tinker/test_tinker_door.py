"""The Tinker API's routes take the door every other route takes: JSON bodies through the server's
parser and its bounds, protobuf bodies through a decoder that checks what they declare before
allocating it, both off the event loop when large, errors in the SDK's `{"detail": ...}` shape,
and a refused operation still takes its `seq_id` turn, so the run goes on."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

import art_backend.tinker._routes as routes  # noqa: E402
from art_backend._json_child import ESCAPES_FOR_A_CHILD  # noqa: E402
from art_backend._limits import MAX_JSON_DEPTH, MAX_JSON_VALUES, MIB  # noqa: E402
from art_backend.tinker._proto_decode import (  # noqa: E402
    MAX_DATUM_TOKENS,
    MAX_DATUMS,
)
from tests.support import protobuf  # noqa: E402
from tests.support.servers import RunningServer, running_tinker_server  # noqa: E402
from tests.support.tinker_bodies import JSON_ROUTES  # noqa: E402

API_KEY = "tml-door-key"
HEADERS = {"X-API-Key": API_KEY}
PROTOBUF = {"content-type": "application/x-protobuf"}
# Enough answers that a loop held for the whole request (a stall) could not have given them.
HEALTH_ANSWERS_WHILE_WORKING = 10


@pytest.fixture(scope="module")
def tinker_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_tinker_server(
        tiny_model_dir, tmp_path_factory.mktemp("door"), api_key=API_KEY
    ) as up:
        yield up


@pytest.fixture(scope="module")
def service(tinker_server: RunningServer) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=tinker_server.url, api_key=API_KEY)
    yield client
    client.close("success")


def api(server: RunningServer, route: str) -> str:
    return f"{server.url}/api/v1/{route}"


def sdk_datums() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints([5, 6, 7]),
            loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0, 1.0, 1.0]},
        )
    ]


def answered(server: RunningServer, started: httpx.Response) -> dict:
    """Poll the future `started` answered until it is done (a test fails rather than hangs)."""
    assert started.status_code == 200, started.text
    request_id = started.json()["request_id"]
    deadline = time.monotonic() + 120
    while True:
        outcome = httpx.post(
            api(server, "retrieve_future"), json={"request_id": request_id}, headers=HEADERS
        ).json()
        if outcome.get("type") != "try_again":
            return outcome
        assert time.monotonic() < deadline, "the operation never ran: a refused turn held it"
        time.sleep(0.05)


# ------------------------------------------------------------------------------ JSON bodies


@pytest.mark.parametrize("route", JSON_ROUTES)
def test_json_nested_past_the_depth_bound_is_a_400_on_every_json_route(tinker_server, route):
    body = b'{"tags": ' + b"[" * 1_000
    answer = httpx.post(api(tinker_server, route), content=body, headers=HEADERS)
    assert answer.status_code == 400
    assert f"more than {MAX_JSON_DEPTH} levels deep" in answer.json()["detail"]


# ------------------------------------------------------------------------------- protobuf


def test_a_double_of_nine_bytes_in_loss_fn_config_is_a_400_naming_it(tinker_server):
    entry = protobuf.length_delimited(1, b"clip") + protobuf.length_delimited(2, b"\x00" * 9)
    body = protobuf.forward_backward_request("tinker-x", 1, []) + protobuf.length_delimited(
        5, entry
    )
    answer = httpx.post(
        api(tinker_server, "forward_backward"), content=body, headers=HEADERS | PROTOBUF
    )
    assert answer.status_code == 400
    assert '`loss_fn_config["clip"]` is 9 bytes; a double is 8' in answer.json()["detail"]


def test_a_sparse_tensor_declaring_2_to_the_34_values_is_refused_before_allocating(
    tinker_server,
):
    tensor = protobuf.number(3, 1) + protobuf.packed(4, [2**34]) + protobuf.length_delimited(2, b"")
    datum = protobuf.loss_input("weights", tensor)
    body = protobuf.forward_backward_request("m", 1, [datum])
    answer = httpx.post(
        api(tinker_server, "forward_backward"), content=body, headers=HEADERS | PROTOBUF
    )
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert '`data[0].loss_fn_inputs["weights"].shape` is [17179869184]' in detail


# ---------------------------------------------------------------------------- seq_id turns


def test_an_optim_step_the_schema_refuses_takes_its_turn_and_the_run_goes_on(
    service: tinker.ServiceClient,
):
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    with pytest.raises(tinker.BadRequestError, match="learning_rate"):
        training.optim_step(types.AdamParams(learning_rate=-1)).result(timeout=60)
    result = training.forward_backward(sdk_datums(), "cross_entropy").result(timeout=120)
    assert result.metrics["loss:sum"] > 0
    assert training.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=120)


def test_a_forward_backward_the_decoder_refuses_takes_its_turn(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    entry = protobuf.length_delimited(1, b"clip") + protobuf.length_delimited(2, b"\x00" * 9)
    refused = protobuf.forward_backward_request(
        training.model_id, 1, []
    ) + protobuf.length_delimited(5, entry)
    answer = httpx.post(
        api(tinker_server, "forward_backward"), content=refused, headers=HEADERS | PROTOBUF
    )
    assert answer.status_code == 400
    step = {"adam_params": {"learning_rate": 1e-3}, "model_id": training.model_id, "seq_id": 2}
    outcome = answered(
        tinker_server, httpx.post(api(tinker_server, "optim_step"), json=step, headers=HEADERS)
    )
    assert outcome["type"] == "optim_step"


# ------------------------------------------------------------- large bodies and the loop


# Each body below held the event loop, /health included, for 0.4 to 40 s before the Tinker routes
# took the door (issue 50). Four are now refused by a bound before their body is decoded, sooner
# than /health could be polled (the decoding itself runs off the loop: the held decoder's test);
# the fifth is answered after work that leaves /health answering throughout.


@dataclass
class Polled:
    """A request's answer, and how many /health answers came after its whole body was sent and
    before its answer came (while the server worked on it)."""

    status: int
    body: dict
    health_answers_while_working: int


def post_polling_health(server: RunningServer, route: str, body: bytes, kind: str) -> Polled:
    """POST `body` on a socket of its own while another thread polls /health."""
    answers = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal answers
        with httpx.Client(base_url=server.url, timeout=120) as client:
            while not done.is_set():
                answers += client.get("/health").status_code == 200

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as connection:
            # A small send buffer: sendall returns once the server has read nearly everything.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            head = (
                f"POST /api/v1/{route} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {API_KEY}\r\n"
                f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            connection.sendall(head.encode())
            connection.sendall(body)
            sent = answers
            status, payload = read_answer(connection)
            working = answers - sent
    finally:
        done.set()
        poller.join()
    return Polled(status, payload, working)


def read_answer(connection: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the HTTP answer on `connection` (sent with Connection: close)."""
    response = b""
    while chunk := connection.recv(1 << 16):
        response += chunk
    head, _, payload = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload)


def test_six_million_values_in_create_session_are_refused_by_the_value_bound(tinker_server):
    body = b'{"tags": [' + b"0," * 6_000_000 + b"0]}"
    polled = post_polling_health(tinker_server, "create_session", body, "application/json")
    assert polled.status == 400
    assert f"more than {MAX_JSON_VALUES:,} JSON values" in polled.body["detail"]


def test_a_body_of_millions_of_escapes_is_parsed_while_health_answers(tinker_server):
    escapes = 9_000_000  # 27 MB of `\",`: parsed in the child process, not on the loop
    assert escapes > ESCAPES_FOR_A_CHILD
    body = b'{"tags": ["' + b'\\",' * escapes + b'"]}'
    polled = post_polling_health(tinker_server, "create_session", body, "application/json")
    assert polled.status == 200
    assert polled.body["type"] == "create_session"
    assert polled.health_answers_while_working >= HEALTH_ANSWERS_WHILE_WORKING


def test_a_datum_of_one_and_a_half_million_tokens_is_refused_before_it_is_read(tinker_server):
    tokens = 1_500_000
    datum = (
        protobuf.text_datum_input(b"\x01\x00\x00\x00" * tokens)
        + protobuf.loss_input(
            "target_tokens",
            protobuf.number(3, 2) + protobuf.length_delimited(1, b"\x00" * 8 * tokens),
        )
        + protobuf.loss_input(
            "weights", protobuf.number(3, 1) + protobuf.length_delimited(1, b"\x00" * 4 * tokens)
        )
    )
    body = protobuf.forward_backward_request("m", 1, [datum])
    polled = post_polling_health(tinker_server, "forward_backward", body, PROTOBUF["content-type"])
    assert polled.status == 400
    detail = polled.body["detail"]
    assert "`data[0].model_input` holds 1,500,000 tokens" in detail
    assert f"at most {MAX_DATUM_TOKENS:,}" in detail


def test_two_and_a_half_million_csr_rows_are_refused_by_their_shape(tinker_server):
    rows = 2_500_000
    csr = protobuf.length_delimited(2, np.zeros(rows + 1, dtype=np.int64).tobytes())
    tensor = (
        protobuf.number(3, 1) + protobuf.packed(4, [rows, 1]) + protobuf.length_delimited(2, csr)
    )
    datum = protobuf.text_datum_input(b"\x01\x00\x00\x00") + protobuf.loss_input("weights", tensor)
    body = protobuf.forward_backward_request("m", 1, [datum])
    polled = post_polling_health(tinker_server, "forward_backward", body, PROTOBUF["content-type"])
    assert polled.status == 400
    assert '`data[0].loss_fn_inputs["weights"].shape` is [2500000, 1]' in polled.body["detail"]


def test_four_hundred_thousand_datums_are_refused_by_their_count(tinker_server):
    target = protobuf.number(3, 2) + protobuf.length_delimited(1, b"\x00" * 8)
    datum = protobuf.text_datum_input(b"\x01\x00\x00\x00") + protobuf.loss_input(
        "target_tokens", target
    )
    body = protobuf.forward_backward_request("m", 1, protobuf.length_delimited(3, datum) * 400_000)
    polled = post_polling_health(tinker_server, "forward_backward", body, PROTOBUF["content-type"])
    assert polled.status == 400
    assert f"`data` holds more than {MAX_DATUMS:,} datums" in polled.body["detail"]


def test_a_large_protobuf_body_is_decoded_off_the_event_loop(tinker_server, monkeypatch):
    """Held inside the decoder, a forward_backward leaves /health answering."""
    called, release = threading.Event(), threading.Event()
    decode = routes.decode_forward_backward

    def held(body: bytes):
        called.set()
        release.wait(60)
        return decode(body)

    monkeypatch.setattr(routes, "decode_forward_backward", held)
    body = protobuf.forward_backward_request("m", 1, [b"\x00" * 8]) + b"\x30\x01" * 16_384
    answer: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answer.append(
            httpx.post(
                api(tinker_server, "forward_backward"),
                content=body,
                headers=HEADERS | PROTOBUF,
                timeout=60,
            )
        )
    )
    sender.start()
    try:
        assert called.wait(60), "the decoder never ran"
        assert httpx.get(f"{tinker_server.url}/health", timeout=20).status_code == 200
    finally:
        release.set()
        sender.join(60)
    assert answer and answer[0].status_code == 400  # field 0: no message has one


# ------------------------------------------------------------------------- error shapes


def raw_answer(server: RunningServer, head: str, body: bytes = b"") -> tuple[int, dict]:
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(head.encode() + body)
        return read_answer(connection)


def too_large(path: str, framing: str) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {API_KEY}\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
        f"{framing}\r\nConnection: close\r\n\r\n"
    )


# The 32 MiB limit in chunks of whitespace, then one byte past it, and nothing more: the server
# reads every byte sent before it answers (a byte left unread would reset the connection).
CHUNKED_PAST_THE_LIMIT = (b"%x\r\n" % MIB + b" " * MIB + b"\r\n") * 32 + b"1\r\n \r\n"


@pytest.mark.parametrize("framing", ["declared", "chunked"])
def test_a_body_over_the_size_limit_is_a_413_in_each_apis_shape(tinker_server, framing):
    """Declared too long, it is refused by the middleware; sent in chunks, by the route that
    reads it (the app's handler answers)."""
    header = "Content-Length: 40000000" if framing == "declared" else "Transfer-Encoding: chunked"
    body = CHUNKED_PAST_THE_LIMIT if framing == "chunked" else b""
    status, answer = raw_answer(tinker_server, too_large("/api/v1/create_session", header), body)
    assert status == 413
    assert list(answer) == ["detail"] and "--max-body-mb" in answer["detail"]
    status, answer = raw_answer(tinker_server, too_large("/v1/chat/completions", header), body)
    assert status == 413
    assert "--max-body-mb" in answer["error"]["message"]


def test_fastapis_own_refusals_on_api_v1_are_sentences_in_detail(tinker_server):
    invalid = httpx.get(
        api(tinker_server, "training_runs"), params={"limit": "ten"}, headers=HEADERS
    )
    assert invalid.status_code == 400
    assert list(invalid.json()) == ["detail"]
    assert "`limit`:" in invalid.json()["detail"]  # the parameter, not `query.limit`
    method = httpx.request("OPTIONS", api(tinker_server, "create_session"), headers=HEADERS)
    assert method.status_code == 405
    assert method.json() == {
        "detail": f"OPTIONS is not a method of /api/v1/create_session; it takes {method.headers['allow']}."
    }
