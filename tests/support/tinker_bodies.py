"""Tinker API request bodies built by hand, valid or hostile, for the fuzz and the soak.

JSON bodies are the SDK's own (`sdk_body`: its pydantic request types, dumped as its resources
dump them); `json_text` writes a body with what `json.dumps` cannot (a nesting deeper than the
encoder recurses) and what it writes only when asked (the `NaN`, `Infinity` tokens).

`forward_backward` bodies are protobuf bytes, written field by field (the field numbers are
`art_backend.tinker._proto`'s docstring), so a test can also write what the SDK never sends:
a wrong wire type, a double of nine bytes, a shape of 2**40 rows. Torch-free and SDK-free, so
the soak can build its 400,000-datum body in a second.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.support.protobuf import double as double_field
from tests.support.protobuf import length_delimited, varint
from tests.support.protobuf import number as varint_field

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
FLOAT32, INT64, INT32 = 1, 2, 3  # Tensor.dtype
# The Tinker API's JSON routes, retrieve_future last (it starts no operation).
JSON_ROUTES = [
    "create_session",
    "session_heartbeat",
    "create_model",
    "get_info",
    "optim_step",
    "save_weights",
    "load_weights",
    "save_weights_for_sampler",
    "create_sampling_session",
    "asample",
    "retrieve_future",
]
DEEP = "\0deep-nesting\0"  # a value `json_text` writes as DEEP_LEVELS nested arrays
DEEP_LEVELS = 100_000


# ------------------------------------------------------------------------------------- JSON


def sdk_body(request: Any) -> dict[str, Any]:
    """A `tinker.types` request as the SDK posts it (its resources' `model_dump` arguments)."""
    return request.model_dump(exclude_unset=False, exclude_none=True, mode="json")


def json_text(body: Any) -> bytes:
    """`body` as JSON bytes: floats NaN and inf as the tokens `NaN`, `Infinity`, lone
    surrogates as `\\ud800` escapes, and each `DEEP` string as DEEP_LEVELS nested arrays."""
    text = json.dumps(body, allow_nan=True)
    deep = "[" * DEEP_LEVELS + "]" * DEEP_LEVELS
    return text.replace(json.dumps(DEEP), deep).encode()


# --------------------------------------------------------------------------------- protobuf


def key(number: int, wire_type: int) -> bytes:
    """A field's key: its number and wire type."""
    return varint(number << 3 | wire_type)


def map_entry(number: int, name: str, value: bytes) -> bytes:
    """One entry of a map field: key (1) `name`, value (2) the already-written `value` field."""
    return length_delimited(number, length_delimited(1, name.encode()) + value)


def tensor(values: Any, dtype: int = FLOAT32, shape: Sequence[int] | None = None) -> bytes:
    """A dense Tensor: the values' bytes, its dtype and shape (the values' own by default)."""
    numpy_type = np.int64 if dtype == INT64 else np.int32 if dtype == INT32 else np.float32
    array = np.asarray(values, dtype=numpy_type)
    dims = list(array.shape) if shape is None else list(shape)
    return (
        length_delimited(1, array.tobytes())
        + varint_field(3, dtype)
        + length_delimited(4, b"".join(varint(dim) for dim in dims))
    )


def sparse_tensor(
    values: Any, crow: Any, col: Any, shape: Sequence[int], dtype: int = FLOAT32
) -> bytes:
    """A sparse CSR Tensor: values, row starts and columns (int64), dtype and shape."""
    csr = (
        length_delimited(1, np.asarray(values, dtype=np.float32).tobytes())
        + length_delimited(2, np.asarray(crow, dtype=np.int64).tobytes())
        + length_delimited(3, np.asarray(col, dtype=np.int64).tobytes())
    )
    packed = b"".join(varint(dim) for dim in shape)
    return length_delimited(2, csr) + varint_field(3, dtype) + length_delimited(4, packed)


def datum(tokens: Any, inputs: Mapping[str, bytes]) -> bytes:
    """A Datum: one encoded_text chunk of int32 `tokens`, and its loss inputs (Tensor bytes)."""
    text = length_delimited(1, np.asarray(tokens, dtype=np.int32).tobytes())
    chunk = length_delimited(1, text)
    return length_delimited(1, chunk) + b"".join(
        map_entry(2, name, length_delimited(2, value)) for name, value in inputs.items()
    )


def policy_datum(tokens: Sequence[int], targets: Sequence[int] | None = None) -> bytes:
    """A datum for the policy losses: targets (the next tokens), sampler logprobs, advantages."""
    count = len(tokens)
    shifted = [*tokens[1:], tokens[0]]
    return datum(
        tokens,
        {
            "target_tokens": tensor(shifted if targets is None else targets, INT64),
            "logprobs": tensor(np.full(count, -1.0)),
            "advantages": tensor(np.full(count, 0.5)),
        },
    )


def forward_backward(
    model_id: str,
    seq_id: int,
    data: Sequence[bytes],
    loss_fn: str = "ppo",
    config: Mapping[str, float] | None = None,
    forward_only: bool = False,
) -> bytes:
    """A ForwardBackwardRequest of `data` (each `datum`'s bytes); numbers in `config` are
    written to both config maps, as the SDK does."""
    body = length_delimited(1, model_id.encode()) + (varint_field(2, seq_id) if seq_id else b"")
    body += b"".join(length_delimited(3, one) for one in data)
    body += length_delimited(4, loss_fn.encode())
    for name, value in (config or {}).items():
        body += map_entry(5, name, double_field(2, value))
        body += map_entry(7, name, length_delimited(2, double_field(1, value)))
    return body + (varint_field(6, 1) if forward_only else b"")


@dataclass(frozen=True)
class FieldSpan:
    """Where one field of a protobuf message lies: its key, and its length varint (None for a
    field that is not length-delimited), as offsets into the whole body."""

    key_at: int
    wire_type: int
    length_at: int | None


def field_spans(body: bytes, start: int = 0, end: int | None = None) -> list[FieldSpan]:
    """Every field of `body`, and of each length-delimited payload that reads as a message
    (a string may read as one too: more places to corrupt, never fewer)."""
    end = len(body) if end is None else end
    spans: list[FieldSpan] = []
    position = start
    while position < end:
        key_at = position
        number_and_type, position = read_varint(body, position, end)
        wire_type = number_and_type & 7
        if wire_type == VARINT:
            _, position = read_varint(body, position, end)
            spans.append(FieldSpan(key_at, wire_type, None))
        elif wire_type in (FIXED64, FIXED32):
            position += 8 if wire_type == FIXED64 else 4
            spans.append(FieldSpan(key_at, wire_type, None))
        elif wire_type == LENGTH_DELIMITED:
            length_at = position
            length, position = read_varint(body, position, end)
            spans.append(FieldSpan(key_at, wire_type, length_at))
            with contextlib.suppress(ValueError):  # bytes, not a message
                spans += field_spans(body, position, position + length)
            position += length
        else:
            raise ValueError(f"wire type {wire_type} at {key_at}")
        if position > end:
            raise ValueError(f"a field at {key_at} runs past its message")
    return spans


def read_varint(body: bytes, position: int, end: int | None = None) -> tuple[int, int]:
    """The varint at `position` and the position after it (ValueError past `end`)."""
    end = len(body) if end is None else min(end, len(body))
    value = shift = 0
    while position < end:
        byte = body[position]
        value |= (byte & 0x7F) << shift
        position += 1
        if not byte & 0x80:
            return value, position
        shift += 7
    raise ValueError("a varint runs past its message")
