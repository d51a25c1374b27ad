"""The `ForwardBackwardRequest` the `tinker` SDK posts, decoded by hand within bounds.

The message and its parts, by field number (the SDK's `tinker_public.proto`, 0.38; the wire
format in `_proto`):

    ForwardBackwardRequest  1 model_id  2 seq_id  3 data (Datum)  4 loss_fn
                            5 loss_fn_config (map str -> double)  6 forward_only
                            7 loss_fn_config_v2 (map str -> LossConfigValue: 1 number | 2 text)
    Datum                   1 model_input (Chunk)  2 loss_fn_inputs (map str -> Tensor)
                            3 model_input_spans  4 loss_fn_input_spans (ProvenanceSpan)
    ProvenanceSpan          1 prompt_tokens | 2 sampled_tokens (1 sequence_id 2 offset 3 length)
    Chunk                   1 encoded_text (1 tokens: int32 bytes) | 2 image | 3 dmel
    Tensor                  1 dense bytes | 2 sparse_csr (1 values 2 crow 3 col: bytes)
                            3 dtype (1 float32, 2 int64, 3 int32, 4 bfloat16)  4 shape

A body is read as a view, never copied, and every length, count and shape it declares is checked
against what is left of it and against the bounds below before anything is allocated for it: a
datum's tokens are counted before they are read, a tensor's values before it is expanded. Each
refusal is a `MalformedProtobufError` (400) naming the field by its path
(`data[3].loss_fn_inputs["weights"].shape`). Decoding is Python, about a microsecond a field, so
the routes run it off the event loop past a few kilobytes (`_limits.parse_off_loop`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from art_backend._errors import MalformedProtobufError

DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.int64),
    3: np.dtype(np.int32),
}
# Field names by number, for the paths a refusal names (`data[3].loss_fn_inputs["weights"]`).
REQUEST_FIELDS = {
    1: "model_id",
    2: "seq_id",
    3: "data",
    4: "loss_fn",
    5: "loss_fn_config",
    6: "forward_only",
    7: "loss_fn_config_v2",
}
DATUM_FIELDS = {
    1: "model_input",
    2: "loss_fn_inputs",
    3: "model_input_spans",
    4: "loss_fn_input_spans",
}
SPAN_KINDS = {1: "prompt_tokens", 2: "sampled_tokens"}
SPAN_FIELDS = {1: "sequence_id", 2: "offset", 3: "length"}
CHUNK_KINDS = {1: "encoded_text", 2: "image", 3: "dmel"}
TEXT_FIELDS = {1: "tokens"}
ENTRY_FIELDS = {1: "key", 2: "value"}
CONFIG_VALUE_FIELDS = {1: "number", 2: "text"}
TENSOR_FIELDS = {1: "dense", 2: "sparse_csr", 3: "dtype", 4: "shape"}
# A loss input is [tokens], or [rows, columns] sent as CSR; numpy refuses past 64 dimensions,
# so a shape is bounded well before, with a message that says what a loss input is.
MAX_DIMENSIONS = 8
CSR_FIELDS = {1: "values", 2: "crow_indices", 3: "col_indices"}

# ---------------------------------------------------------------------------------- bounds
# What one request may declare, checked before anything is allocated for it. No real run comes
# near them: the SDK sends a batch in requests of at most 1,024 datums and about 5 MB (tinker
# 0.38's `ClientConfigResponse.fwdbwd_max_chunk_len`, `fwdbwd_max_chunk_bytes_count`; a datum
# larger than that goes alone), and the tinker cookbook's RL batches (a few thousand datums of
# a few thousand tokens) reach the server through those requests. A client of its own that
# sends such a batch whole still fits.
MAX_DATUMS = 8_192  # eight of the SDK's largest requests
# Four times the longest context of the models Tinker trains (Qwen3's 2507 models: 262,144
# tokens natively); the served model's own context is checked after decoding (`_service`).
MAX_DATUM_TOKENS = 2**20
# A 2,048 x 2,048 batch sent whole; over ten times the ~300,000 tokens of the SDK's largest
# request (5 MB at 16 bytes a token: the int32 token, its int64 target, a float32 weight).
MAX_REQUEST_TOKENS = 2**22
# Loss-input values in all (what sparse tensors expand to counts): the served losses read at
# most three a token (`_losses`), so four a token is room to spare; 128 MiB as int64 at most.
MAX_REQUEST_VALUES = 4 * MAX_REQUEST_TOKENS
# Fields read in one request: the SDK's largest has about 18 a datum, some 20,000 in all. Each
# costs one to two microseconds of Python: this many is a fraction of a second (off the loop).
MAX_FIELDS = 2**18
# model_id, loss_fn and the keys of the maps are names, never long texts.
MAX_NAME_BYTES = 1_024
INT32_BYTES = 4  # an encoded_text token
FieldValue = int | memoryview
Fields = dict[int, list[FieldValue]]


@dataclass
class WireTensor:
    """A `loss_fn_inputs` tensor, dense (a sparse CSR one is expanded, zeros elsewhere)."""

    values: np.ndarray


@dataclass(frozen=True)
class WireSpan:
    """A provenance run: `length` positions that are `[offset, offset + length)` of a sampled
    sequence's prompt (`sampled` False) or sampled tokens (`Datum.with_provenance`)."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


@dataclass
class WireDatum:
    """One datum: its input tokens (the text chunks, in order), its loss inputs, and its
    provenance (None when the datum carries none)."""

    tokens: list[int]
    inputs: dict[str, WireTensor]
    other_chunks: list[str] = field(default_factory=list)  # image, dmel: not served
    model_input_spans: list[WireSpan] | None = None
    loss_fn_input_spans: list[WireSpan] | None = None


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


def decode_forward_backward(data: bytes) -> ForwardBackwardWire:
    """The SDK's `ForwardBackwardRequest` bytes, decoded: a MalformedProtobufError naming the
    field when they are not that message, or declare more than this server's bounds."""
    return _Reader(len(data)).request(memoryview(data))


def request_turn(data: bytes) -> tuple[str | None, int | None]:
    """The model_id and seq_id (None when absent or 0) a ForwardBackwardRequest names, read
    leniently from a body that did not decode (the SDK writes them first), so that a refused
    request still takes its turn in its run."""
    model_id: str | None = None
    seq_id: int | None = None
    try:
        for number, value in _Reader(len(data)).walk(memoryview(data), "", REQUEST_FIELDS):
            if number == 1 and isinstance(value, memoryview) and len(value) <= MAX_NAME_BYTES:
                model_id = str(value, "utf-8", "replace")
            elif number == 2 and isinstance(value, int):
                seq_id = value
            if model_id is not None and seq_id is not None:
                break
    except MalformedProtobufError:
        pass
    return model_id, seq_id or None


class _Reader:
    """One request's decoding: the fields, tokens and loss-input values read so far, each held
    to its bound before the memory for it is asked for."""

    def __init__(self, body_bytes: int) -> None:
        self.body_bytes = body_bytes
        self.fields = self.tokens = self.values = 0

    def walk(
        self, data: memoryview, where: str, names: dict[int, str]
    ) -> Iterator[tuple[int, FieldValue]]:
        """A message's fields in order: (number, varint or bytes); every length checked."""
        position = 0
        while position < len(data):
            self.fields += 1
            if self.fields > MAX_FIELDS:
                raise _refused(
                    "",
                    f"holds more than {MAX_FIELDS:,} protobuf fields, more than this server "
                    "reads in one request. Send fewer datums in one request",
                )
            key, position = _varint(data, position, where)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise _refused(where, "has a field numbered 0, which no message has")
            value: FieldValue
            if wire == 0:
                value, position = _varint(data, position, _child(where, names, number))
                yield number, value
                continue
            if wire in (1, 5):
                length = 8 if wire == 1 else 4
            elif wire == 2:
                length, position = _varint(data, position, _child(where, names, number))
            else:
                raise _refused(_child(where, names, number), f"has wire type {wire}, unused here")
            if position + length > len(data):
                raise _refused(
                    _child(where, names, number),
                    f"declares {length:,} bytes; {len(data) - position:,} are left in its message",
                )
            yield number, data[position : position + length]
            position += length

    def message(self, data: memoryview, where: str, names: dict[int, str]) -> Fields:
        """Field number -> its values in order."""
        found: Fields = {}
        for number, value in self.walk(data, where, names):
            found.setdefault(number, []).append(value)
        return found

    def request(self, data: memoryview) -> ForwardBackwardWire:
        """The whole request; datums counted as they are met, before any is decoded."""
        fields: Fields = {}
        datums = 0
        for number, value in self.walk(data, "", REQUEST_FIELDS):
            datums += number == 3
            if datums > MAX_DATUMS:
                raise _refused(
                    "data",
                    f"holds more than {MAX_DATUMS:,} datums, more than this server "
                    "decodes in one request. Send fewer in one request (the SDK sends at most "
                    "1,024)",
                )
            fields.setdefault(number, []).append(value)
        config: dict[str, float | str] = {}
        for name, entry, where in self.entries(fields.get(5, []), "loss_fn_config"):
            config[name] = _double(_last(entry, 2), where)
        for name, entry, where in self.entries(fields.get(7, []), "loss_fn_config_v2"):
            setting = self.message(_blob(entry, 2, where), where, CONFIG_VALUE_FIELDS)
            if 2 in setting:  # v2 wins where both are set
                config[name] = _text(setting, 2, f"{where}.text")
            elif 1 in setting:
                config[name] = _double(_last(setting, 1), f"{where}.number")
        datums_read = [
            self.datum(_as_message(value, f"data[{index}]"), f"data[{index}]")
            for index, value in enumerate(fields.get(3, []))
        ]
        return ForwardBackwardWire(
            model_id=_text(fields, 1, "model_id"),
            seq_id=_integer(fields, 2, "seq_id"),
            loss_fn=_text(fields, 4, "loss_fn"),
            loss_fn_config=config,
            forward_only=bool(_integer(fields, 6, "forward_only")),
            data=datums_read,
        )

    def entries(self, values: list[FieldValue], where: str) -> Iterator[tuple[str, Fields, str]]:
        """A map field's entries: (key, the entry's fields, whose value is field 2; its path)."""
        for value in values:
            entry = self.message(_as_message(value, where), where, ENTRY_FIELDS)
            name = _text(entry, 1, f"{where} key")
            yield name, entry, f'{where}["{name}"]'

    def datum(self, data: memoryview, where: str) -> WireDatum:
        """One datum: its text chunks' tokens (counted before they are read) and loss inputs."""
        fields = self.message(data, where, DATUM_FIELDS)
        datum = WireDatum(tokens=[], inputs={})
        for index, chunk in enumerate(fields.get(1, [])):
            chunk_where = f"{where}.model_input[{index}]"
            kinds = self.message(_as_message(chunk, chunk_where), chunk_where, CHUNK_KINDS)
            if 1 not in kinds:
                datum.other_chunks += [CHUNK_KINDS.get(number, str(number)) for number in kinds]
                continue
            text_where = f"{chunk_where}.encoded_text"
            text = self.message(_blob(kinds, 1, text_where), text_where, TEXT_FIELDS)
            tokens = _blob(text, 1, f"{text_where}.tokens")
            if len(tokens) % INT32_BYTES:
                raise _refused(
                    f"{text_where}.tokens", f"has {len(tokens):,} bytes, not whole int32 tokens"
                )
            self.count_tokens(len(datum.tokens), len(tokens) // INT32_BYTES, where)
            datum.tokens += np.frombuffer(tokens, dtype=np.int32).tolist()
        for name, entry, entry_where in self.entries(fields.get(2, []), f"{where}.loss_fn_inputs"):
            datum.inputs[name] = self.tensor(_blob(entry, 2, entry_where), entry_where)
        if 3 in fields or 4 in fields:
            datum.model_input_spans = self.spans(fields.get(3, []), f"{where}.model_input_spans")
            datum.loss_fn_input_spans = self.spans(
                fields.get(4, []), f"{where}.loss_fn_input_spans"
            )
        return datum

    def spans(self, values: list[FieldValue], where: str) -> list[WireSpan]:
        """A datum's provenance runs, in order."""
        spans = []
        for index, value in enumerate(values):
            span_where = f"{where}[{index}]"
            kinds = self.message(_as_message(value, span_where), span_where, SPAN_KINDS)
            sampled = 2 in kinds
            arm_where = f"{span_where}.{SPAN_KINDS[2 if sampled else 1]}"
            arm = self.message(_blob(kinds, 2 if sampled else 1, arm_where), arm_where, SPAN_FIELDS)
            spans.append(
                WireSpan(
                    sampled=sampled,
                    sequence_id=_text(arm, 1, f"{arm_where}.sequence_id"),
                    offset=_integer(arm, 2, f"{arm_where}.offset"),
                    length=_integer(arm, 3, f"{arm_where}.length"),
                )
            )
        return spans

    def count_tokens(self, datum_tokens: int, added: int, where: str) -> None:
        """Refuse tokens past a datum's or the request's bound, before they are read."""
        self.tokens += added
        if datum_tokens + added > MAX_DATUM_TOKENS:
            raise _refused(
                f"{where}.model_input",
                f"holds {datum_tokens + added:,} tokens or more; a datum has at most "
                f"{MAX_DATUM_TOKENS:,} here (four times the longest context Tinker trains). "
                "Send a shorter datum",
            )
        if self.tokens > MAX_REQUEST_TOKENS:
            raise _refused(
                "data",
                f"holds more than {MAX_REQUEST_TOKENS:,} tokens in all, more than this "
                "server decodes in one request. Send fewer datums in one request",
            )

    def tensor(self, data: memoryview, where: str) -> WireTensor:
        """A loss input: its dtype, its shape (bounded first), then its dense or CSR values."""
        fields = self.message(data, where, TENSOR_FIELDS)
        number = _integer(fields, 3, f"{where}.dtype")
        dtype = DTYPES.get(number)
        if dtype is None:
            raise _refused(
                f"{where}.dtype",
                f"is {number}; this server reads 1 (float32), 2 (int64), 3 (int32)",
            )
        shape = self.shape(fields, f"{where}.shape")
        if 2 in fields:
            return WireTensor(self.sparse(_blob(fields, 2, where), dtype, shape, where))
        dense = _blob(fields, 1, f"{where}.dense")
        if shape is None:  # one dimension, as long as the bytes
            if len(dense) % dtype.itemsize:
                raise _refused(
                    f"{where}.dense", f"has {len(dense):,} bytes, not whole {dtype.name} values"
                )
            shape = [len(dense) // dtype.itemsize]
        needed = self.count_values(shape, f"{where}.shape") * dtype.itemsize
        if len(dense) != needed:
            raise _refused(
                f"{where}.dense",
                f"has {len(dense):,} bytes; shape {shape} of {dtype.name} takes {needed:,}",
            )
        return WireTensor(np.frombuffer(dense, dtype=dtype).reshape(shape))

    def shape(self, fields: Fields, where: str) -> list[int] | None:
        """The declared shape (packed or not), every dimension counted and non-negative."""
        if 4 not in fields:
            return None
        dimensions: list[int] = []
        for value in fields[4]:
            if isinstance(value, int):
                dimensions.append(value)
                continue
            position = 0
            while position < len(value):
                self.fields += 1
                if self.fields > MAX_FIELDS:
                    raise _refused(where, f"has more than {MAX_FIELDS:,} dimensions")
                number, position = _varint(value, position, where)
                dimensions.append(number)
        if any(number >= 2**63 for number in dimensions):
            signed = [number - 2**64 if number >= 2**63 else number for number in dimensions]
            raise _refused(where, f"is {signed}: a dimension is negative")
        if len(dimensions) > MAX_DIMENSIONS:
            raise _refused(
                where,
                f"has {len(dimensions)} dimensions; a loss input has one value per token (a "
                f"sparse one [rows, columns]): at most {MAX_DIMENSIONS}",
            )
        return dimensions

    def count_values(self, shape: list[int], where: str) -> int:
        """The values `shape` declares, refused past one datum's or the request's bound."""
        values = math.prod(shape)
        # One value per input token (`_service` checks the shape is [tokens]); each token takes
        # 4 bytes of the body, and a datum has at most MAX_DATUM_TOKENS of them.
        bound = min(MAX_DATUM_TOKENS, self.body_bytes // INT32_BYTES)
        if values > bound:
            raise _refused(
                where,
                f"is {shape}: {values:,} values, more than a loss input holds here (at most "
                f"{bound:,}: one per input token, and a datum has at most {MAX_DATUM_TOKENS:,} "
                f"tokens, a body of {self.body_bytes:,} bytes at most a quarter as many). Send "
                "one value per input token",
            )
        self.values += values
        if self.values > MAX_REQUEST_VALUES:
            raise _refused(
                where,
                f"brings the request's loss-input values past {MAX_REQUEST_VALUES:,}, "
                "more than this server decodes in one request. Send fewer datums in one request",
            )
        return values

    def sparse(
        self, data: memoryview, dtype: np.dtype[Any], shape: list[int] | None, where: str
    ) -> np.ndarray:
        """A CSR tensor, its three arrays checked against its shape and each other, expanded."""
        if shape is not None:
            self.count_values(shape, f"{where}.shape")
        if shape is None or len(shape) != 2:
            raise _refused(
                f"{where}.shape", f"is {shape or []}; a sparse CSR tensor takes [rows, columns]"
            )
        rows, columns = shape
        csr_where = f"{where}.sparse_csr"
        csr = self.message(data, csr_where, CSR_FIELDS)
        values = _blob(csr, 1, f"{csr_where}.values")
        crow = _blob(csr, 2, f"{csr_where}.crow_indices")
        col = _blob(csr, 3, f"{csr_where}.col_indices")
        if len(values) % dtype.itemsize:
            raise _refused(
                f"{csr_where}.values", f"has {len(values):,} bytes, not whole {dtype.name} values"
            )
        stored = len(values) // dtype.itemsize
        if len(crow) != 8 * (rows + 1):
            raise _refused(
                f"{csr_where}.crow_indices",
                f"has {len(crow):,} bytes; {rows:,} rows take {rows + 1:,} int64 pointers",
            )
        if len(col) != 8 * stored:
            raise _refused(
                f"{csr_where}.col_indices",
                f"has {len(col):,} bytes; {stored:,} values take as many int64 columns",
            )
        pointers = np.frombuffer(crow, dtype=np.int64)
        steps = np.diff(pointers)
        if pointers[0] != 0 or pointers[-1] != stored or (steps < 0).any():
            raise _refused(
                f"{csr_where}.crow_indices", f"must rise from 0 to the {stored:,} values"
            )
        places = np.frombuffer(col, dtype=np.int64)
        if stored and (places.min() < 0 or places.max() >= columns):
            raise _refused(f"{csr_where}.col_indices", f"holds a column outside [0, {columns:,})")
        dense = np.zeros(shape, dtype=dtype)
        dense[np.repeat(np.arange(rows), steps), places] = np.frombuffer(values, dtype=dtype)
        return dense


def _refused(where: str, problem: str) -> MalformedProtobufError:
    """A 400 naming the field by its path (`data[3].loss_fn_inputs["weights"].shape`)."""
    subject = f"`{where}`" if where else "the request"
    return MalformedProtobufError(
        f"forward_backward's body: {subject} {problem}.", param=where or "body"
    )


def _child(where: str, names: dict[int, str], number: int) -> str:
    name = names.get(number, f"field {number}")
    return f"{where}.{name}" if where else name


def _varint(data: memoryview, position: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data):
            raise _refused(where, "has a varint that runs past the end of its message")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise _refused(where, "has a varint longer than 64 bits")


def _last(fields: Fields, number: int) -> FieldValue | None:
    values = fields.get(number)
    return values[-1] if values else None  # proto3: the last value of a field wins


def _blob(fields: Fields, number: int, where: str) -> memoryview:
    value = _last(fields, number)
    if value is None:
        return memoryview(b"")
    return _as_message(value, where)


def _as_message(value: FieldValue, where: str) -> memoryview:
    if isinstance(value, int):
        raise _refused(where, "is a number; it should be length-delimited (bytes or a message)")
    return value


def _text(fields: Fields, number: int, where: str) -> str:
    value = _blob(fields, number, where)
    if len(value) > MAX_NAME_BYTES:
        raise _refused(
            where, f"has {len(value):,} bytes; a name here has at most {MAX_NAME_BYTES:,}"
        )
    return str(value, "utf-8", "replace")


def _integer(fields: Fields, number: int, where: str) -> int:
    value = _last(fields, number)
    if value is None:
        return 0
    if not isinstance(value, int):
        raise _refused(where, "is bytes; it should be a varint")
    return value


def _double(value: FieldValue | None, where: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, int) or len(value) != 8:
        found = "a varint" if isinstance(value, int) else f"{len(value)} bytes"
        raise _refused(where, f"is {found}; a double is 8 bytes")
    return float(struct.unpack("<d", value)[0])
