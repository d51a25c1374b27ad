"""The protobuf messages the `tinker` SDK sends and reads, decoded and written by hand.

The SDK posts `forward_backward` as `application/x-protobuf` and asks for the results of
`forward_backward` and `asample` in protobuf (`Accept: application/x-protobuf`); everything
else is JSON. The schema is the SDK's `tinker_public.proto` (0.38); only the fields below are
read or written, by field number. Protobuf's wire format is small enough to speak directly
(a key varint `number << 3 | wire_type`, then a varint, 8 or 4 bytes, or a length and bytes),
which keeps the server free of the SDK and of a protobuf runtime.

    ForwardBackwardRequest  1 model_id  2 seq_id  3 data (Datum)  4 loss_fn
                            5 loss_fn_config (map str -> double)  6 forward_only
                            7 loss_fn_config_v2 (map str -> LossConfigValue: 1 number | 2 text)
    Datum                   1 model_input (Chunk)  2 loss_fn_inputs (map str -> Tensor)
    Chunk                   1 encoded_text (1 tokens: int32 bytes) | 2 image | 3 dmel
    Tensor                  1 dense bytes | 2 sparse_csr (1 values 2 crow 3 col: bytes)
                            3 dtype (1 float32, 2 int64, 3 int32, 4 bfloat16)  4 shape
    ForwardBackwardOutput   1 loss_fn_output_type  2 loss_fn_outputs (ArrayRecord)
                            3 metrics (map str -> double)
    ArrayRecord             2 fields (map str -> BatchedTensor)  3 num_datums
    BatchedTensor           1 data  2 offsets (int64 byte offsets, datums + 1)  3 dtype
    SampleResponse          1 sequences (SampledSequence)
    SampledSequence         1 stop_reason (0 stop, 1 length)  2 tokens (int32)  3 logprobs (f32)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from art_backend._errors import MalformedProtobufError

DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.int64),
    3: np.dtype(np.int32),
}
DTYPE_NUMBERS = {"float32": 1, "int64": 2}
CHUNK_KINDS = {1: "encoded_text", 2: "image", 3: "dmel"}
STOP_REASONS = {"stop": 0, "length": 1}


@dataclass
class WireTensor:
    """A `loss_fn_inputs` tensor, dense (a sparse CSR one is expanded, zeros elsewhere)."""

    values: np.ndarray


@dataclass
class WireDatum:
    """One datum: its input tokens (the text chunks, in order) and its loss inputs."""

    tokens: list[int]
    inputs: dict[str, WireTensor]
    other_chunks: list[str] = field(default_factory=list)  # image, dmel: not served


@dataclass
class ForwardBackwardWire:
    """A decoded `ForwardBackwardRequest`."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


# ------------------------------------------------------------------------------------- reading


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data):
            raise MalformedProtobufError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise MalformedProtobufError("varint longer than 64 bits")


def _fields(data: bytes) -> dict[int, list[int | bytes]]:
    """Field number -> its values in order: ints (varints) or bytes (the rest)."""
    found: dict[int, list[int | bytes]] = {}
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, position = _varint(data, position)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, position = data[position : position + size], position + size
        elif wire == 2:
            length, position = _varint(data, position)
            value, position = data[position : position + length], position + length
        else:
            raise MalformedProtobufError(f"unsupported wire type {wire} (field {number})")
        if position > len(data):
            raise MalformedProtobufError(f"field {number} runs past the end of the message")
        found.setdefault(number, []).append(value)
    return found


def _one(fields: dict[int, list[int | bytes]], number: int, default: int | bytes) -> int | bytes:
    values = fields.get(number)
    return values[-1] if values else default  # proto3: the last value of a field wins


def _text(fields: dict[int, list[int | bytes]], number: int) -> str:
    value = _one(fields, number, b"")
    if not isinstance(value, bytes):
        raise MalformedProtobufError(f"field {number} should be a string")
    return value.decode("utf-8", "replace")


def _bytes(fields: dict[int, list[int | bytes]], number: int) -> bytes:
    value = _one(fields, number, b"")
    if not isinstance(value, bytes):
        raise MalformedProtobufError(f"field {number} should be bytes")
    return value


def _int(fields: dict[int, list[int | bytes]], number: int) -> int:
    value = _one(fields, number, 0)
    if not isinstance(value, int):
        raise MalformedProtobufError(f"field {number} should be an integer")
    return value


def _packed_ints(values: list[int | bytes]) -> list[int]:
    numbers: list[int] = []
    for value in values:
        if isinstance(value, int):
            numbers.append(value)
            continue
        position = 0
        while position < len(value):
            number, position = _varint(value, position)
            numbers.append(number)
    return numbers


def _map(values: list[int | bytes]) -> list[tuple[str, dict[int, list[int | bytes]]]]:
    """A map field's entries: (key, the entry's fields; its value is field 2)."""
    entries = []
    for value in values:
        if not isinstance(value, bytes):
            raise MalformedProtobufError("a map entry should be a message")
        entry = _fields(value)
        entries.append((_text(entry, 1), entry))
    return entries


def _tensor(data: bytes) -> WireTensor:
    fields = _fields(data)
    dtype = DTYPES.get(_int(fields, 3))
    if dtype is None:
        raise MalformedProtobufError(f"unsupported tensor dtype {_int(fields, 3)}")
    shape = [
        number if number < 2**63 else number - 2**64 for number in _packed_ints(fields.get(4, []))
    ]
    try:
        if 2 in fields:
            csr = _fields(_bytes(fields, 2))
            dense = np.zeros(shape, dtype=dtype)
            values = np.frombuffer(_bytes(csr, 1), dtype=dtype)
            crow = np.frombuffer(_bytes(csr, 2), dtype=np.int64)
            col = np.frombuffer(_bytes(csr, 3), dtype=np.int64)
            for row in range(len(crow) - 1):
                dense[row, col[crow[row] : crow[row + 1]]] = values[crow[row] : crow[row + 1]]
            return WireTensor(dense)
        values = np.frombuffer(_bytes(fields, 1), dtype=dtype)
        return WireTensor(values.reshape(shape) if shape else values)
    except (ValueError, IndexError) as error:
        raise MalformedProtobufError(
            f"a tensor's values do not fit its shape {shape}: {error}"
        ) from None


def _datum(data: bytes) -> WireDatum:
    fields = _fields(data)
    datum = WireDatum(tokens=[], inputs={})
    for chunk in fields.get(1, []):
        if not isinstance(chunk, bytes):
            raise MalformedProtobufError("a model_input chunk should be a message")
        kinds = _fields(chunk)
        if 1 in kinds:
            tokens = _bytes(_fields(_bytes(kinds, 1)), 1)
            if len(tokens) % 4:
                raise MalformedProtobufError("encoded_text tokens are not whole int32 values")
            datum.tokens += np.frombuffer(tokens, dtype=np.int32).tolist()
        else:
            datum.other_chunks += [CHUNK_KINDS.get(number, str(number)) for number in kinds]
    for name, entry in _map(fields.get(2, [])):
        datum.inputs[name] = _tensor(_bytes(entry, 2))
    return datum


def decode_forward_backward(data: bytes) -> ForwardBackwardWire:
    """The SDK's `ForwardBackwardRequest` bytes, decoded (MalformedProtobufError when they are not)."""
    fields = _fields(data)
    config: dict[str, float | str] = {}
    for name, entry in _map(fields.get(5, [])):
        config[name] = struct.unpack("<d", _bytes(entry, 2).ljust(8, b"\0"))[0]
    for name, entry in _map(fields.get(7, [])):  # v2 wins where both are set
        value = _fields(_bytes(entry, 2))
        if 2 in value:
            config[name] = _text(value, 2)
        elif 1 in value:
            config[name] = struct.unpack("<d", _bytes(value, 1))[0]
    return ForwardBackwardWire(
        model_id=_text(fields, 1),
        seq_id=_int(fields, 2),
        loss_fn=_text(fields, 4),
        loss_fn_config=config,
        forward_only=bool(_int(fields, 6)),
        data=[_datum(value) for value in fields.get(3, []) if isinstance(value, bytes)],
    )


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


def encode_sample_response(sequences: list[WireSequence]) -> bytes:
    """A `SampleResponse` with its sequences (logprobs where asked for)."""
    body = b""
    for sequence in sequences:
        message = _field_int(1, STOP_REASONS[sequence.stop_reason])
        message += _field_bytes(2, np.asarray(sequence.tokens, dtype=np.int32).tobytes())
        if sequence.logprobs is not None:
            message += _field_bytes(3, np.asarray(sequence.logprobs, dtype=np.float32).tobytes())
        body += _field_bytes(1, message)
    return body
