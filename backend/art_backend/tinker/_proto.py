"""The protobuf answers the `tinker` SDK reads, written by hand; its request is decoded within
bounds in `_proto_decode` (named here too).

The SDK posts `forward_backward` as `application/x-protobuf` and asks for the results of
`forward_backward` and `asample` in protobuf (`Accept: application/x-protobuf`); everything
else is JSON. The schema is the SDK's `tinker_public.proto` (0.38); only the fields listed
(here and in `_proto_decode`) are read or written, by field number. Protobuf's wire format is
small enough to speak directly (a key varint `number << 3 | wire_type`, then a varint, 8 or 4
bytes, or a length and bytes), which keeps the server free of the SDK and of a protobuf runtime.

    ForwardBackwardOutput   1 loss_fn_output_type  2 loss_fn_outputs (ArrayRecord)
                            3 metrics (map str -> double)
    ArrayRecord             2 fields (map str -> BatchedTensor)  3 num_datums
    BatchedTensor           1 data  2 offsets (int64 byte offsets, datums + 1)  3 dtype
    SampleResponse          1 sequences (SampledSequence)  2 prompt_logprobs (f32, NaN: none)
                            3 topk_prompt_logprobs (TopkLogprobs)
    TopkLogprobs            1 token_ids (int32 [length, k])  2 logprobs (f32)  3 k  4 length
    SampledSequence         1 stop_reason (0 stop, 1 length)  2 tokens (int32)  3 logprobs (f32)
                            4 topk_sampled_logprobs (TopkLogprobs)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from art_backend.tinker._proto_decode import (
    ForwardBackwardWire,
    WireDatum,
    WireTensor,
    decode_forward_backward,
)

__all__ = [
    "ForwardBackwardWire",
    "WireDatum",
    "WireSequence",
    "WireTensor",
    "decode_forward_backward",
    "encode_forward_backward_output",
    "encode_sample_response",
]

DTYPE_NUMBERS = {"float32": 1, "int64": 2}
STOP_REASONS = {"stop": 0, "length": 1}


# ------------------------------------------------------------------------------------- writing


def _key(number: int, wire: int) -> bytes:
    return _varint_bytes(number << 3 | wire)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_bytes(number: int, value: bytes) -> bytes:
    return _key(number, 2) + _varint_bytes(len(value)) + value


def _field_int(number: int, value: int) -> bytes:
    return _key(number, 0) + _varint_bytes(value) if value else b""


def _field_double(number: int, value: float) -> bytes:
    return _key(number, 1) + struct.pack("<d", value)


def _batched(arrays: list[np.ndarray], dtype: str) -> bytes:
    numpy_type = np.dtype(dtype)
    sizes = [0] + [len(array) * numpy_type.itemsize for array in arrays]
    data = b"".join(np.asarray(array, dtype=numpy_type).tobytes() for array in arrays)
    offsets = np.cumsum(sizes, dtype=np.int64).tobytes()
    return _field_bytes(1, data) + _field_bytes(2, offsets) + _field_int(3, DTYPE_NUMBERS[dtype])


def encode_forward_backward_output(
    outputs: dict[str, list[np.ndarray]], metrics: dict[str, float], datums: int
) -> bytes:
    """A `ForwardBackwardOutput`: per field (logprobs, elementwise_loss) one float32 array per
    datum, in one ArrayRecord; and the metrics."""
    record = b"".join(
        _field_bytes(
            2, _field_bytes(1, name.encode()) + _field_bytes(2, _batched(arrays, "float32"))
        )
        for name, arrays in outputs.items()
    )
    record += _field_int(3, datums)
    body = _field_bytes(1, b"ArrayRecord") + _field_bytes(2, record)
    for name, value in metrics.items():
        body += _field_bytes(3, _field_bytes(1, name.encode()) + _field_double(2, value))
    return body


@dataclass
class WireSequence:
    """One sampled sequence of a `SampleResponse`."""

    stop_reason: str  # "stop" | "length"
    tokens: list[int]
    logprobs: list[float] | None
    top: tuple[np.ndarray, np.ndarray] | None = None  # each sampled token's top (ids, logprobs)


def encode_sample_response(
    sequences: list[WireSequence],
    prompt_logprobs: np.ndarray | None = None,
    top_prompt_logprobs: tuple[np.ndarray, np.ndarray] | None = None,
) -> bytes:
    """A `SampleResponse` with its sequences (logprobs where asked for), and the prompt's
    logprobs [T] and top (ids, logprobs), each [T, k], where asked for."""
    body = b""
    if prompt_logprobs is not None:
        body += _field_bytes(2, np.asarray(prompt_logprobs, dtype=np.float32).tobytes())
    if top_prompt_logprobs is not None:
        body += _field_bytes(3, _topk_logprobs(*top_prompt_logprobs))
    for sequence in sequences:
        message = _field_int(1, STOP_REASONS[sequence.stop_reason])
        message += _field_bytes(2, np.asarray(sequence.tokens, dtype=np.int32).tobytes())
        if sequence.logprobs is not None:
            message += _field_bytes(3, np.asarray(sequence.logprobs, dtype=np.float32).tobytes())
        if sequence.top is not None:
            message += _field_bytes(4, _topk_logprobs(*sequence.top))
        body += _field_bytes(1, message)
    return body


def _topk_logprobs(ids: np.ndarray, logprobs: np.ndarray) -> bytes:
    """A TopkLogprobs message of (ids, logprobs), each [length, k]."""
    length, k = ids.shape
    top = _field_bytes(1, np.asarray(ids, dtype=np.int32).tobytes())
    top += _field_bytes(2, np.asarray(logprobs, dtype=np.float32).tobytes())
    return top + _field_int(3, k) + _field_int(4, length)
