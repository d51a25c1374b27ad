"""The protobuf messages, read and written by hand, against the SDK's own codec: what the SDK
sends decodes to the same datums, and what the server writes decodes in the SDK to the same
arrays. A body that is not the message, or declares more than the server's bounds, is refused
before anything is allocated for it, naming the field."""

from __future__ import annotations

import numpy as np
import pytest

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import (  # noqa: E402
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from art_backend._errors import MalformedProtobufError  # noqa: E402
from art_backend.tinker._proto import (  # noqa: E402
    WireSequence,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)
from art_backend.tinker._proto_decode import (  # noqa: E402
    MAX_DATUM_TOKENS,
    MAX_DATUMS,
    MAX_FIELDS,
    MAX_REQUEST_VALUES,
    request_turn,
)
from tests.support.protobuf import (  # noqa: E402
    double,
    forward_backward_request,
    length_delimited,
    loss_input,
    number,
    packed,
    text_datum_input,
)


def test_the_sdks_forward_backward_request_decodes_to_its_datums():
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0.0, 0.5, 0.25]},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum], loss_fn="cross_entropy", loss_fn_config={"clip": 0.2, "mode": "x"}
        ),
        model_id="tinker-abc",
        seq_id=3,
    )
    message = forward_backward_request_to_proto(request)
    message.forward_only = True
    wire = decode_forward_backward(message.SerializeToString())
    assert (wire.model_id, wire.seq_id, wire.loss_fn, wire.forward_only) == (
        "tinker-abc",
        3,
        "cross_entropy",
        True,
    )
    assert wire.loss_fn_config == {"clip": pytest.approx(0.2), "mode": "x"}
    (decoded,) = wire.data
    assert decoded.tokens == [5, 6, 7]
    assert decoded.inputs["target_tokens"].values.tolist() == [6, 7, 8]
    assert decoded.inputs["weights"].values.tolist() == [0.0, 0.5, 0.25]


def test_a_sparse_tensor_is_expanded():
    import torch

    weights = torch.zeros(2, 6)
    weights[1, 4] = 3.0
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"weights": weights, "target_tokens": [1, 2]},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id="m",
        seq_id=1,
    )
    wire = decode_forward_backward(forward_backward_request_to_proto(request).SerializeToString())
    assert wire.data[0].inputs["weights"].values.tolist() == weights.tolist()


def test_a_sparse_tensor_with_empty_rows_expands_row_by_row():
    values = np.array([1.5, 2.5, 3.5], dtype=np.float32).tobytes()
    crow = np.array([0, 2, 2, 3], dtype=np.int64).tobytes()  # row 1 is empty
    col = np.array([0, 3, 1], dtype=np.int64).tobytes()
    wire = decode_forward_backward(request(sparse_weights([3, 4], values, crow, col)))
    expanded = wire.data[0].inputs["weights"].values
    assert expanded.tolist() == [[1.5, 0, 0, 2.5], [0, 0, 0, 0], [0, 3.5, 0, 0]]


def request(*datum_fields: bytes, seq_id: int = 1) -> bytes:
    """A request of one datum (one token, then `datum_fields`)."""
    return forward_backward_request(
        "m", seq_id, [text_datum_input(b"\x01\0\0\0") + b"".join(datum_fields)]
    )


def sparse_weights(shape: list[int], values: bytes, crow: bytes, col: bytes) -> bytes:
    """A `weights` loss input as a float32 CSR tensor."""
    csr = length_delimited(1, values) + length_delimited(2, crow) + length_delimited(3, col)
    return loss_input("weights", number(3, 1) + packed(4, shape) + length_delimited(2, csr))


def dense_weights(shape: list[int], data: bytes) -> bytes:
    return loss_input("weights", number(3, 1) + packed(4, shape) + length_delimited(1, data))


def config(name: str, value: bytes) -> bytes:
    """A loss_fn_config entry whose value is `value` (its field, as written)."""
    return length_delimited(5, length_delimited(1, name.encode()) + value)


INT64_ZERO = b"\0" * 8
WEIGHTS = '`data[0].loss_fn_inputs["weights"]'
REFUSALS = {
    "a varint that runs off the end": (b"\x10\xff\xff", "`seq_id` has a varint that runs past"),
    "a length past the end": (b"\x0a\x05ab", "`model_id` declares 5 bytes; 2 are left"),
    "a field numbered 0": (b"\x00\x01", "a field numbered 0"),
    "a wire type no message uses": (b"\x0b", "`model_id` has wire type 3"),
    "a double of 9 bytes": (
        request() + config("clip", length_delimited(2, b"\0" * 9)),
        '`loss_fn_config["clip"]` is 9 bytes; a double is 8',
    ),
    "a double of 4 bytes": (
        request() + config("clip", b"\x15" + b"\0" * 4),
        '`loss_fn_config["clip"]` is 4 bytes; a double is 8',
    ),
    "a double sent as a varint": (
        request() + config("clip", number(2, 1)),
        '`loss_fn_config["clip"]` is a varint; a double is 8 bytes',
    ),
    "tokens that are not whole int32s": (
        forward_backward_request("m", 1, [text_datum_input(b"\x01\0\0")]),
        "`data[0].model_input[0].encoded_text.tokens` has 3 bytes, not whole int32",
    ),
    "a shape of 100 dimensions": (
        request(dense_weights([1] * 100, b"\0" * 4)),
        f"{WEIGHTS}.shape` has 100 dimensions; a loss input has one value per token",
    ),
    "dense bytes that do not fit the shape": (
        request(dense_weights([3], b"\0" * 8)),
        f"{WEIGHTS}.dense` has 8 bytes; shape [3] of float32 takes 12",
    ),
    "a negative dimension": (
        request(dense_weights([-1], b"")),
        f"{WEIGHTS}.shape` is [-1]: a dimension is negative",
    ),
    "a sparse shape of 2**34 values": (
        request(sparse_weights([2**34], b"", b"", b"")),
        f"{WEIGHTS}.shape` is [17179869184]: 17,179,869,184 values",
    ),
    "a sparse shape of 10**8 values": (
        request(sparse_weights([1, 10**8], b"", INT64_ZERO * 2, b"")),
        f"{WEIGHTS}.shape` is [1, 100000000]",
    ),
    "a sparse shape of one dimension": (
        request(sparse_weights([4], b"", b"", b"")),
        f"{WEIGHTS}.shape` is [4]; a sparse CSR tensor takes [rows, columns]",
    ),
    "row pointers that disagree with the rows": (
        request(sparse_weights([2, 2], b"", INT64_ZERO * 2, b"")),
        f"{WEIGHTS}.sparse_csr.crow_indices` has 16 bytes; 2 rows take 3",
    ),
    "columns that disagree with the values": (
        request(sparse_weights([1, 2], b"\0" * 4, INT64_ZERO + np.int64(1).tobytes(), b"")),
        f"{WEIGHTS}.sparse_csr.col_indices` has 0 bytes; 1 values take as many",
    ),
    "row pointers that fall": (
        request(
            sparse_weights(
                [2, 2],
                b"\0" * 4,
                np.array([0, 1, 0], dtype=np.int64).tobytes(),
                INT64_ZERO,
            )
        ),
        f"{WEIGHTS}.sparse_csr.crow_indices` must rise from 0 to the 1 values",
    ),
    "a column outside the shape": (
        request(
            sparse_weights(
                [1, 2], b"\0" * 4, np.array([0, 1], dtype=np.int64).tobytes(), np.int64(2).tobytes()
            )
        ),
        f"{WEIGHTS}.sparse_csr.col_indices` holds a column outside [0, 2)",
    ),
    "a dtype not served": (
        request(loss_input("weights", number(3, 4))),
        f"{WEIGHTS}.dtype` is 4; this server reads 1 (float32)",
    ),
    "a model_id of 2,000 bytes": (
        forward_backward_request("m" * 2_000, 1, []),
        "`model_id` has 2,000 bytes; a name here has at most 1,024",
    ),
}


@pytest.mark.parametrize("body, message", REFUSALS.values(), ids=REFUSALS.keys())
def test_a_body_that_is_not_the_message_is_refused_naming_the_field(body: bytes, message: str):
    with pytest.raises(MalformedProtobufError) as refused:
        decode_forward_backward(body)
    assert message in refused.value.message
    assert refused.value.status_code == 400


def test_more_datums_than_the_bound_are_refused_before_any_is_read():
    datum = length_delimited(3, b"\xff")  # not a message: it would be refused if it were read
    with pytest.raises(MalformedProtobufError, match=f"more than {MAX_DATUMS:,} datums"):
        decode_forward_backward(forward_backward_request("m", 1, datum * (MAX_DATUMS + 1)))


def test_a_datum_past_the_token_bound_is_refused_before_its_tokens_are_read():
    tokens = length_delimited(1, b"\0" * 4 * (MAX_DATUM_TOKENS + 1))
    body = forward_backward_request("m", 1, [length_delimited(1, length_delimited(1, tokens))])
    with pytest.raises(MalformedProtobufError, match=f"at most {MAX_DATUM_TOKENS:,} here"):
        decode_forward_backward(body)


def test_loss_inputs_past_the_requests_value_bound_are_refused():
    """Each sparse tensor is within one datum's bound; together they pass the request's."""
    empty_row = INT64_ZERO * 2
    datum = text_datum_input(b"\x01\0\0\0") + sparse_weights(
        [1, MAX_DATUM_TOKENS], b"", empty_row, b""
    )
    datums = MAX_REQUEST_VALUES // MAX_DATUM_TOKENS + 1
    padding = length_delimited(15, b"\0" * 4 * MAX_DATUM_TOKENS)  # an unknown field, skipped
    body = forward_backward_request("m", 1, [datum] * datums) + padding
    with pytest.raises(MalformedProtobufError, match=f"past {MAX_REQUEST_VALUES:,}"):
        decode_forward_backward(body)


def test_more_fields_than_the_bound_are_refused():
    body = number(6, 1) * (MAX_FIELDS + 1)
    with pytest.raises(MalformedProtobufError, match=f"more than {MAX_FIELDS:,} protobuf fields"):
        decode_forward_backward(body)


def test_a_refused_body_still_names_its_run_and_turn():
    body = request(sparse_weights([2**34], b"", b"", b""), seq_id=7)
    with pytest.raises(MalformedProtobufError):
        decode_forward_backward(body)
    assert request_turn(body) == ("m", 7)
    assert request_turn(body[:3] + b"\xff") == ("m", None)  # cut before its seq_id
    assert request_turn(double(2, 1.0)) == (None, None)  # a seq_id that is no varint


def test_the_servers_answers_decode_in_the_sdk():
    logprobs = [np.array([-1.0, -2.5], dtype=np.float32), np.array([-0.5], dtype=np.float32)]
    body = encode_forward_backward_output(
        {"logprobs": logprobs, "elementwise_loss": [-x for x in logprobs]}, {"loss:sum": 4.0}, 2
    )
    output = deserialize_forward_backward_output(body)
    assert output.metrics == {"loss:sum": 4.0}
    assert [o["logprobs"].tolist() for o in output.loss_fn_outputs] == [[-1.0, -2.5], [-0.5]]
    assert output.loss_fn_outputs[1]["elementwise_loss"].tolist() == [0.5]

    sample = deserialize_sample_response(
        encode_sample_response(
            [WireSequence("length", [4, 5], [-0.25, -1.0]), WireSequence("stop", [9], None)]
        )
    )
    assert [(s.stop_reason, s.tokens, s.logprobs) for s in sample.sequences] == [
        ("length", [4, 5], [-0.25, -1.0]),
        ("stop", [9], None),
    ]
