"""The protobuf messages, read and written by hand, against the SDK's own codec: what the SDK
sends decodes to the same datums, and what the server writes decodes in the SDK to the same
arrays."""

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


def test_bytes_that_are_not_the_message_are_refused():
    with pytest.raises(MalformedProtobufError):
        decode_forward_backward(b"\x0a\xff\xff")


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
