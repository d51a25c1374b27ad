"""The Tinker API fuzzed like the other routes: hostile bodies get a clear refusal, never a 5xx.

`/api/v1/*` is not in /openapi.json, so schemathesis (tests/server/test_schemathesis.py) does
not reach it. Here every JSON route starts from the body the `tinker` SDK sends (its own
request types, `sdk_body`) and `forward_backward` from the protobuf bytes it sends; hypothesis
(derandomized: the same requests every run) removes a field, gives one another JSON type, a
huge or negative number, `NaN`, a deep nesting, a long string, a lone surrogate, an unknown id;
and corrupts the protobuf's bytes, lengths, varints and wire types, or declares tensors that do
not fit. Every answer must be under 500 and, when an error, `{"detail": str}`; an operation
that answers a future is polled until done, and a failure of bad input is the user's
(category "user"), never the server's. A keyed server answers 401 without its key.

The requests aim at a live training run (created once per server) so they reach the trainer.
Every request that names the run carries a fresh seq_id: a refused one must still take its turn,
or the run's later operations wait for it forever; after each refusal that carried the run's
next seq_id, a probe (a forward pass with the seq_id after it) must finish.

Each test collects every failing request and reports them together.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'")

from tinker import types
from tinker.proto import tinker_public_pb2
from tinker.proto.request_conv import forward_backward_request_to_proto

from tests.support import tinker_bodies as wire
from tests.support.tinker_fuzz import (
    ORDERED_ROUTES,
    PROTOBUF,
    REMOVED,
    REPLACEMENTS,
    WHOLE_BODIES,
    LiveRun,
    answer_problem,
    decoded_turn,
    field_paths,
    fuzz_settings,
    live_server,
    mutated,
    report,
    sdk_request,
    send_forward_backward,
    valid_forward_backward,
)

API_KEY = "tml-fuzz-key"  # the SDK's keys start with `tml-`
EXAMPLES_PER_ROUTE = 30


@pytest.fixture(scope="module", params=[None, API_KEY], ids=["open", "keyed"])
def live(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveRun]:
    """A server of its own, with a live run and what the routes' bodies name."""
    path = tmp_path_factory.mktemp("art-tinker-fuzz")
    with live_server(tiny_model_dir, path, request.param) as run:
        yield run


# ------------------------------------------------------------------------------ JSON bodies


def carried_turn(run: LiveRun, route: str, body: Any, seq_id: int) -> int | None:
    """The run's seq_id the body carries readably (its turn to take), or None."""
    ordered = route in ORDERED_ROUTES and isinstance(body, dict)
    if not ordered or body.get("model_id") != run.model_id:
        return None
    carried = body.get("seq_id")
    return seq_id if type(carried) is int and carried == seq_id else None


FUZZ_SETTINGS = fuzz_settings(EXAMPLES_PER_ROUTE)


def test_the_sdks_own_bodies_are_served(live: LiveRun):
    """The fuzz starts from bodies the server serves: each reaches the code behind its route."""
    for route in wire.JSON_ROUTES[:-1]:
        seq_id = live.take_seq_id() if route in ORDERED_ROUTES else 0
        live.call(route, wire.sdk_body(sdk_request(live, route, seq_id)))


@pytest.mark.parametrize("route", wire.JSON_ROUTES)
def test_mutated_json_bodies_get_no_5xx_and_no_server_failures(live: LiveRun, route: str):
    live.begin()
    paths = field_paths(wire.sdk_body(sdk_request(live, route, 1)))
    changes = [REMOVED, *REPLACEMENTS]
    whole = st.tuples(st.just(()), st.sampled_from(sorted(WHOLE_BODIES)))
    one_field = st.tuples(st.sampled_from(paths), st.sampled_from(changes))

    @given(mutation=st.one_of(one_field, one_field, one_field, whole))
    @FUZZ_SETTINGS
    def call(mutation: tuple[tuple[Any, ...], str]) -> None:
        path, change = mutation
        seq_id = live.next_seq_id
        body = wire.sdk_body(sdk_request(live, route, seq_id))
        if path:
            body = mutated(body, path, change)
            content = wire.json_text(body)
            turn = None if change == "a deep nesting" else carried_turn(live, route, body, seq_id)
        else:
            content, turn = WHOLE_BODIES[change], None
        if turn is not None:
            live.take_seq_id()
        label = f"{route} with {'.'.join(map(str, path)) or 'the body'} {change}"
        live.send(label, route, content, "application/json", turn)

    call()
    report(live)


# -------------------------------------------------------------------------- protobuf bodies


def test_the_hand_built_forward_backward_is_the_one_the_sdk_sends():
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([3, 4, 5]),
        loss_fn_inputs={
            "target_tokens": [4, 5, 3],
            "logprobs": [-1.0] * 3,
            "advantages": [0.5] * 3,
        },
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum], loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.8}
        ),
        model_id="tinker-x",
        seq_id=7,
    )
    ours = wire.forward_backward(
        "tinker-x", 7, [wire.policy_datum([3, 4, 5])], "ppo", {"clip_low_threshold": 0.8}
    )
    parsed = tinker_public_pb2.ForwardBackwardRequest.FromString(ours)
    assert parsed == forward_backward_request_to_proto(request)
    assert wire.field_spans(ours)[0] == wire.FieldSpan(0, wire.LENGTH_DELIMITED, 1)


def test_forward_backward_truncated_anywhere_gets_no_5xx(live: LiveRun):
    live.begin()
    for cut in range(len(valid_forward_backward(live, live.next_seq_id))):
        seq_id = live.next_seq_id
        body = valid_forward_backward(live, seq_id)[:cut]
        label = f"forward_backward cut to its first {cut} bytes"
        send_forward_backward(live, label, body, decoded_turn(live, body, seq_id))
    report(live)


CORRUPTIONS = ["a flipped byte", "a wire type", "a length", "an overlong varint"]
LENGTHS = [1, -1, 2**31, 2**62, 2**64 - 1]  # a length's change (small) or new value (large)


def corrupted(body: bytes, kind: str, where: int, value: int) -> bytes:
    """`body` with one corruption of `kind`; `where` picks the byte or field (modulo their
    count), `value` the new byte, wire type or length."""
    spans = wire.field_spans(body)
    span = spans[where % len(spans)]
    data = bytearray(body)
    if kind == "a flipped byte":
        data[where % len(data)] ^= value % 255 + 1
    elif kind == "a wire type":
        data[span.key_at] = data[span.key_at] & ~7 | value % 8
    elif kind == "an overlong varint":
        data[span.key_at : span.key_at] = b"\xff" * (10 + value % 8)
    else:
        lengths = [one for one in spans if one.length_at is not None]
        at = lengths[where % len(lengths)].length_at
        assert at is not None
        old, end = wire.read_varint(body, at)
        change = LENGTHS[value % len(LENGTHS)]
        new = old + change if abs(change) < 2 else change
        data[at:end] = wire.varint(max(new, 0))
    return bytes(data)


def test_forward_backward_with_corrupted_bytes_gets_no_5xx(live: LiveRun):
    live.begin()

    @given(
        kind=st.sampled_from(CORRUPTIONS),
        where=st.integers(0, 10_000),
        value=st.integers(0, 255),
    )
    @settings(FUZZ_SETTINGS, max_examples=3 * EXAMPLES_PER_ROUTE)
    def call(kind: str, where: int, value: int) -> None:
        seq_id = live.next_seq_id
        body = corrupted(valid_forward_backward(live, seq_id), kind, where, value)
        label = f"forward_backward with {kind} ({where}, {value})"
        send_forward_backward(live, label, body, decoded_turn(live, body, seq_id))

    call()
    report(live)


def hostile_bodies(model_id: str, seq_id: int) -> dict[str, tuple[bytes, bool]]:
    """forward_backward bodies that decode, or nearly, into what no datum can be: name ->
    (body, whether it carries the run's model_id and seq_id intact)."""
    tokens, nan, inf = [3, 4, 5], math.nan, math.inf

    def ppo(*data: bytes, loss: str = "ppo", extra: bytes = b"", **config: float) -> bytes:
        body = wire.forward_backward(model_id, seq_id, list(data), loss, config)
        return body + extra

    def policy(tokens: Any = tokens, **inputs: bytes) -> bytes:
        base = {
            "target_tokens": wire.tensor([4, 5, 6], wire.INT64),
            "logprobs": wire.tensor([-1.0] * 3),
            "advantages": wire.tensor([0.5] * 3),
        }
        return wire.datum(tokens, {**base, **inputs})

    def weighted(weights: list[float]) -> bytes:
        inputs = {
            "target_tokens": wire.tensor([4, 5, 6], wire.INT64),
            "weights": wire.tensor(weights),
        }
        return ppo(wire.datum(tokens, inputs), loss="cross_entropy")

    def config_entry(number: int, value: bytes) -> bytes:
        return wire.map_entry(number, "clip_low_threshold", value)

    nine_bytes = wire.length_delimited(2, b"\0" * 9)
    image = wire.length_delimited(1, wire.length_delimited(2, wire.length_delimited(1, b"png")))
    raw_tensor = wire.length_delimited(1, b"\0" * 5) + wire.varint_field(3, wire.FLOAT32)
    return {
        "a double of 9 bytes in loss_fn_config": (
            ppo(policy(), extra=config_entry(5, nine_bytes)),
            True,
        ),
        "a double of 9 bytes in loss_fn_config_v2": (
            ppo(
                policy(),
                extra=config_entry(
                    7, wire.length_delimited(2, wire.length_delimited(1, b"\0" * 9))
                ),
            ),
            True,
        ),
        "a text where loss_fn_config_v2 has a number": (
            ppo(
                policy(),
                extra=config_entry(7, wire.length_delimited(2, wire.length_delimited(2, b"\xff"))),
            ),
            True,
        ),
        "NaN in loss_fn_config": (ppo(policy(), clip_low_threshold=nan), True),
        "an unknown loss_fn_config key": (ppo(policy(), nope=1.0), True),
        "a dense tensor of shape [2**40]": (
            ppo(policy(advantages=wire.tensor([0.5] * 3, shape=[2**40]))),
            True,
        ),
        "a dense tensor of shape [2**62, 2**62]": (
            ppo(policy(advantages=wire.tensor([0.5] * 3, shape=[2**62, 2**62]))),
            True,
        ),
        "a dense tensor of 100 dimensions": (
            ppo(policy(advantages=wire.tensor([0.5], shape=[1] * 100))),
            True,
        ),
        "a dense tensor of shape [-1]": (
            ppo(policy(advantages=wire.tensor([0.5] * 3, shape=[-1]))),
            True,
        ),
        "dense bytes shorter than the shape": (
            ppo(policy(advantages=wire.tensor([0.5] * 2, shape=[3]))),
            True,
        ),
        "dense bytes that are not whole values": (ppo(policy(advantages=raw_tensor)), True),
        "a sparse tensor of shape [2**20, 2**20]": (
            ppo(policy(advantages=wire.sparse_tensor([1.0], [0, 1], [0], [2**20, 2**20]))),
            True,
        ),
        "a sparse tensor of shape [2**40]": (
            ppo(policy(advantages=wire.sparse_tensor([1.0], [0, 1], [0], [2**40]))),
            True,
        ),
        "a sparse tensor whose rows run past its values": (
            ppo(policy(advantages=wire.sparse_tensor([1.0], [0, 9], [0], [1, 3]))),
            True,
        ),
        "a sparse tensor with a column out of range": (
            ppo(policy(advantages=wire.sparse_tensor([1.0], [0, 1], [2**40], [1, 3]))),
            True,
        ),
        "a sparse tensor with a negative column": (
            ppo(policy(advantages=wire.sparse_tensor([1.0], [0, 1], [-5], [1, 3]))),
            True,
        ),
        "a bfloat16 tensor": (ppo(policy(advantages=wire.tensor([0.5] * 3, dtype=4))), True),
        "a tensor of dtype 99": (ppo(policy(advantages=wire.tensor([0.5] * 3, dtype=99))), True),
        "NaN weights": (weighted([nan] * 3), True),
        "infinite weights": (weighted([inf, -inf, 1.0]), True),
        "NaN advantages": (ppo(policy(advantages=wire.tensor([nan] * 3))), True),
        "infinite advantages": (ppo(policy(advantages=wire.tensor([inf, -inf, inf]))), True),
        "NaN logprobs": (ppo(policy(logprobs=wire.tensor([nan] * 3))), True),
        "infinite logprobs": (ppo(policy(logprobs=wire.tensor([-inf, inf, -inf]))), True),
        "token ids out of the vocabulary": (ppo(policy([3, 2**31 - 1, 5])), True),
        "negative token ids": (ppo(policy([-1, 4, -(2**31)])), True),
        "target_tokens out of the vocabulary": (
            ppo(policy(target_tokens=wire.tensor([4, 2**62, -7], wire.INT64))),
            True,
        ),
        "target_tokens as NaN floats": (ppo(policy(target_tokens=wire.tensor([nan] * 3))), True),
        "tokens that are not whole int32 values": (
            ppo(
                wire.length_delimited(
                    1, wire.length_delimited(1, wire.length_delimited(1, b"\1" * 5))
                )
            ),
            True,
        ),
        "an image chunk": (ppo(image + policy()), True),
        "no datum": (ppo(), True),
        "a datum of 100,000 tokens": (
            ppo(
                policy(
                    list(range(100_000)),
                    target_tokens=wire.tensor(range(100_000), wire.INT64),
                    logprobs=wire.tensor([0.0] * 100_000),
                    advantages=wire.tensor([0.0] * 100_000),
                )
            ),
            True,
        ),
        "an unknown loss": (ppo(policy(), loss="nope"), True),
        "a loss not served yet": (ppo(policy(), loss="custom"), True),
        "forward_only of 2**64 - 1": (ppo(policy(), extra=wire.varint_field(6, 2**64 - 1)), True),
        "unknown fields": (
            ppo(policy(), extra=wire.varint_field(99, 1) + wire.length_delimited(2**29 - 1, b"x")),
            True,
        ),
        "a group (wire type 3)": (ppo(policy(), extra=wire.key(9, 3)), True),
        "a length of 2**30 with nothing after it": (
            ppo(policy(), extra=wire.key(3, 2) + wire.varint(2**30)),
            True,
        ),
        "a negative seq_id": (wire.forward_backward(model_id, -1, [policy()]), False),
        "a seq_id of 2**63": (wire.forward_backward(model_id, 2**63, [policy()]), False),
        "an unknown model_id": (wire.forward_backward("tinker-0000", seq_id, [policy()]), False),
        "a model_id that is not UTF-8": (
            wire.length_delimited(1, b"\xff\xfe") + wire.forward_backward("", seq_id, [policy()]),
            False,
        ),
    }


def well_formed(body: bytes) -> bool:
    """Every field of the message reads (whatever the values say)."""
    try:
        wire.field_spans(body)
    except ValueError:
        return False
    return True


def test_forward_backward_with_hostile_datums_gets_no_5xx_and_no_server_failures(live: LiveRun):
    live.begin()
    for name in hostile_bodies(live.model_id, 1):
        seq_id = live.next_seq_id
        body, carries = hostile_bodies(live.model_id, seq_id)[name]
        # Its model_id and seq_id read, it must take its turn, even when refused; a body whose
        # wire format breaks cannot be read that far with certainty.
        turn = seq_id if carries and well_formed(body) else None
        send_forward_backward(live, f"forward_backward with {name}", body, turn)
    for content_type, headers in [
        ("application/json", {}),
        (PROTOBUF, {"content-encoding": "gzip"}),
    ]:
        body = valid_forward_backward(live, 10**9)
        response = live.http.post(
            "/api/v1/forward_backward",
            content=body,
            headers={"content-type": content_type, **headers, **live.headers()},
        )
        problem = answer_problem(response)
        if problem or response.status_code != 400:
            live.failures.append(
                f"forward_backward as {content_type} {headers}: {problem or response.status_code}"
            )
    report(live)
