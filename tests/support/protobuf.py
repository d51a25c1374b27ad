"""Protobuf messages written by hand, byte by byte, as a client that is not the SDK may write them:
what the SDK's own classes cannot express (a double of 9 bytes, a shape of 2**34) and bodies of
millions of parts, built by concatenation in milliseconds."""

from __future__ import annotations

import struct


def varint(value: int) -> bytes:
    """`value` as a protobuf varint (a negative one as its 64-bit two's complement)."""
    value &= 2**64 - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def number(field: int, value: int) -> bytes:
    """A varint field."""
    return varint(field << 3) + varint(value)


def length_delimited(field: int, payload: bytes) -> bytes:
    """A bytes, string or message field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def double(field: int, value: float) -> bytes:
    """A double field (wire type 1: 8 bytes)."""
    return varint(field << 3 | 1) + struct.pack("<d", value)


def packed(field: int, values: list[int]) -> bytes:
    """A packed repeated varint field (a tensor's shape)."""
    return length_delimited(field, b"".join(varint(value) for value in values))


def text_datum_input(token_bytes: bytes) -> bytes:
    """A Datum's `model_input` chunk of encoded_text: the int32 tokens' bytes."""
    return length_delimited(1, length_delimited(1, length_delimited(1, token_bytes)))


def loss_input(name: str, tensor: bytes) -> bytes:
    """A Datum's `loss_fn_inputs` entry: `name` -> the Tensor message `tensor`."""
    return length_delimited(2, length_delimited(1, name.encode()) + length_delimited(2, tensor))


def forward_backward_request(
    model_id: str, seq_id: int, datums: list[bytes] | bytes, loss_fn: str = "cross_entropy"
) -> bytes:
    """A ForwardBackwardRequest: its header fields, then the datums (messages, or their fields
    already joined)."""
    head = length_delimited(1, model_id.encode()) + number(2, seq_id)
    joined = (
        datums if isinstance(datums, bytes) else b"".join(length_delimited(3, d) for d in datums)
    )
    return head + joined + length_delimited(4, loss_fn.encode())
