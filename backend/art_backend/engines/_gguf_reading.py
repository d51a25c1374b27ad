"""Reading a GGUF file: its header checked whole before a conversion, and gguf's reader shared
while one runs.

`read_gguf_metadata` walks the header (magic, version, metadata, tensor table) with struct over a
memory map and checks that every tensor's bytes lie inside the file: a file cut anywhere, or
garbled, is refused with one ModelLoadError saying where, before anything is written. Only scalar
and string values are kept; arrays (a 262k-token vocabulary, its scores, its merges) are stepped
over, each string checked to be UTF-8. It takes a fifth of a second on Gemma 3's vocabulary,
where gguf.GGUFReader takes nine, and it is at least as strict: its checks are GGUFReader's own
(versions 2 and 3, known value and ggml types, no key or tensor twice, a power-of-two uint32
alignment, tensors that fill their blocks), so what it accepts, the readers transformers uses
parse. GGUFReader itself raises IndexError, ValueError, UnicodeDecodeError or KeyError on a cut
or garbled file depending on where the damage falls (issue 49: a cut header ended art-server
with "IndexError: index 0 is out of bounds").

`parsed_once` makes the several `gguf.GGUFReader(path)` calls of one conversion share one reader.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_backend._errors import ModelLoadError

GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
# The GGUF metadata keys whose token ids end generation (gguf.Keys.Tokenizer EOS_ID, EOT_ID, EOM_ID).
STOP_TOKEN_KEYS = (
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
)


@dataclass(frozen=True)
class GgufMetadata:
    """What conversion needs from a GGUF's header before transformers reads it."""

    architecture: str
    tensor_count: int
    declared_stop_ids: list[int]


def read_gguf_metadata(gguf_path: Path) -> GgufMetadata:
    """The architecture, tensor count and declared stop ids of `gguf_path`; ModelLoadError if
    the file is not a readable GGUF (cut short, garbled, or no GGUF at all).

    The whole header is walked and every tensor's bytes are checked to lie inside the file, so a
    download cut anywhere is refused here, before anything is written or announced.
    """
    try:
        fields, tensor_count = _read_header(gguf_path)
        architecture = fields.get("general.architecture")
        if not isinstance(architecture, str):
            raise ValueError("its metadata names no general.architecture")
        parts = fields.get("split.count", 1)
        declared = [fields[key] for key in STOP_TOKEN_KEYS if isinstance(fields.get(key), int)]
    except (ValueError, OSError) as exc:
        raise ModelLoadError(
            f"'{gguf_path}' is not a readable GGUF file ({exc}). Check that the download is "
            "complete, or pass a model folder saved with save_pretrained()."
        ) from exc
    if isinstance(parts, int) and parts > 1:
        raise ModelLoadError(
            f"'{gguf_path.name}' is one part of a GGUF split into {parts} files, which "
            "transformers cannot read. Merge the parts first: `llama-gguf-split --merge "
            f"{gguf_path.name} merged.gguf`, then pass merged.gguf."
        )
    return GgufMetadata(
        architecture=architecture,
        tensor_count=tensor_count,
        declared_stop_ids=[int(token_id) for token_id in declared],
    )


# --- walking the header -------------------------------------------------------------------------

# GGUF metadata value types (gguf.GGUFValueType) of fixed size, as struct formats; 8 is a
# string (uint64 length, UTF-8 bytes) and 9 an array (uint32 element type, uint64 count, items).
_SCALAR_FORMATS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_VERSIONS = (2, 3)  # what gguf.GGUFReader reads (v1 counted in 32 bits)
_DEFAULT_ALIGNMENT = 32
# GGUFReader files the three counts under these names, so a metadata key spelled so is a duplicate.
_RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})
_MAX_NESTING = 8  # arrays of arrays: llama.cpp writes none; garbled bytes could nest without end


def _read_header(gguf_path: Path) -> tuple[dict[str, Any], int]:
    """The file's scalar and string metadata (arrays left out) and its tensor count; ValueError
    (or OSError) saying what is wrong."""
    with gguf_path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise ValueError("the file is empty")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _HeaderWalk(data, size).read()


class _HeaderWalk:
    """One pass over a GGUF header: magic, version, counts, metadata, tensor table, tensor extents."""

    def __init__(self, data: mmap.mmap, size: int) -> None:
        self.data = data
        self.size = size
        self.pos = 0
        self.order = "<"  # GGUF is little-endian unless its version reads byte-swapped
        self.part = "header"  # where the walk is, for a message about a cut

    def read(self) -> tuple[dict[str, Any], int]:
        if self.data[:4] != GGUF_MAGIC:
            raise ValueError("it does not start with the GGUF magic bytes")
        self.pos = 4
        (version,) = self._take("I")
        if version & 0xFFFF == 0:  # written on a big-endian machine
            self.order = ">"
            (version,) = struct.unpack(">I", struct.pack("<I", version))
        if version not in _VERSIONS:
            raise ValueError(f"GGUF version {version}; the readers here take versions 2 and 3")
        tensor_count, kv_count = self._take("QQ")
        self.part = "metadata"
        fields: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self._text(self._string(), "a metadata key")
            if key in fields or key in _RESERVED_KEYS:
                raise ValueError(f"its metadata holds {key!r} twice")
            (kind,) = self._take("I")
            fields[key] = self._value(kind)
            if key == "general.alignment" and kind != _UINT32:
                raise ValueError("general.alignment is not a uint32")
        self.part = "tensor table"
        tensors = [self._tensor_info() for _ in range(tensor_count)]
        alignment = fields.get("general.alignment", _DEFAULT_ALIGNMENT)
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment} is not a power of two")
        data_start = -(-self.pos // alignment) * alignment
        names: set[str] = set()
        for name, offset, length in tensors:
            if name in names:
                raise ValueError(f"it holds tensor {name!r} twice")
            names.add(name)
            end = data_start + offset + length
            if end > self.size:
                raise ValueError(
                    f"it ends at byte {self.size:,}, inside its tensor data: tensor {name!r} "
                    f"needs bytes up to {end:,}"
                )
        return fields, tensor_count

    def _take(self, fmt: str) -> tuple[Any, ...]:
        fmt = self.order + fmt
        width = struct.calcsize(fmt)
        self._need(width)
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += width
        return values

    def _need(self, count: int) -> None:
        if self.pos + count > self.size:
            raise ValueError(f"it ends at byte {self.size:,}, inside its {self.part}")

    def _skip(self, count: int) -> None:
        self._need(count)
        self.pos += count

    def _string(self) -> bytes:
        (length,) = self._take("Q")
        start = self.pos
        self._skip(length)
        return self.data[start : self.pos]

    @staticmethod
    def _text(raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} is not UTF-8: {raw[:40]!r}") from None

    def _value(self, kind: int, depth: int = 0) -> Any:
        """A scalar or a string decoded; an array stepped over (None)."""
        if kind in _SCALAR_FORMATS:
            return self._take(_SCALAR_FORMATS[kind])[0]
        if kind == _STRING:
            return self._text(self._string(), "a metadata string")
        if kind == _ARRAY:
            item, count = self._take("IQ")
            if item in _SCALAR_FORMATS:
                self._skip(count * struct.calcsize(_SCALAR_FORMATS[item]))
            elif item == _STRING:  # a vocabulary, its merges: each must be UTF-8 too
                for _ in range(count):  # each at least 8 bytes: a cut ends this soon enough
                    self._text(self._string(), "a metadata string")
            elif item == _ARRAY:
                if depth >= _MAX_NESTING:
                    raise ValueError(f"its metadata nests arrays over {_MAX_NESTING} deep")
                for _ in range(count):
                    self._value(_ARRAY, depth + 1)
            else:
                raise ValueError(f"its metadata holds an array of unknown type {item}")
            return None
        raise ValueError(f"its metadata holds a value of unknown type {kind}")

    def _tensor_info(self) -> tuple[str, int, int]:
        """One tensor's name, offset in the data section, and size in bytes."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        name = self._text(self._string(), "a tensor name")
        (dimensions,) = self._take("I")
        shape = self._take(f"{dimensions}Q") if dimensions else ()
        ggml_type, offset = self._take("IQ")
        try:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name!r} has unknown ggml type {ggml_type}") from None
        elements = math.prod(shape)
        if block_size > 1 and (not shape or shape[0] % block_size):
            raise ValueError(f"tensor {name!r} of shape {list(shape)} does not fill its blocks")
        return name, offset, elements * type_size // block_size


# --- one reader for a conversion -------------------------------------------------------------


@dataclass
class _Sharing:
    """What parsed_once put in place: the reader class it replaced, and the readers it shares
    among the conversions running in this process, by file."""

    original: Any
    readers: dict[tuple[str, str, int, int], Any]
    conversions: int = 0


_sharing: _Sharing | None = None
_sharing_lock = threading.Lock()


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Within the block, `gguf.GGUFReader(path)` parses a file once, quickly, and hands out that
    reader again.

    transformers reads the families of its legacy GGUF tables (llama, qwen2, gemma3 and most
    others) with gguf.GGUFReader, which slices a numpy view for every metadata array element:
    9 s of CPU for Gemma 3's 262k-token vocabulary. It did so three times per conversion: for the
    config, for the tokenizer (AutoTokenizer reads the config again to pick its class) and for
    the weights. The reader is read-only, so one serves all three; and slicing a plain ndarray
    view of its memory map instead of the np.memmap itself (whose every slice runs memmap's
    __array_finalize__) parses in a third of the time, the same fields and tensors.

    transformers imports the class at each call (`from gguf import GGUFReader`), which is what
    this replaces for the block's duration; were that to change, or GGUFReader's `_get`, the
    file would just be parsed as often and as slowly as before.
    """
    import gguf

    module: Any = gguf
    global _sharing
    with _sharing_lock:
        if _sharing is None:
            _sharing = _Sharing(original=module.GGUFReader, readers={})
            module.GGUFReader = _shared_reader_class(_sharing)
        sharing = _sharing
        sharing.conversions += 1
    try:
        yield
    finally:
        with _sharing_lock:
            sharing.conversions -= 1
            if sharing.conversions == 0:
                module.GGUFReader = sharing.original
                _sharing = None


def _shared_reader_class(sharing: _Sharing) -> Any:
    """A stand-in for gguf.GGUFReader whose `GGUFReader(path)` is `sharing`'s reader of it."""
    import numpy as np

    original: Any = sharing.original

    class QuickReader(original):  # type: ignore[misc]
        def _get(self, *args: Any, **kwargs: Any) -> Any:
            data: Any = self.__dict__["data"]
            if type(data) is np.memmap:  # the first read, in __init__
                self.__dict__["data"] = data.view(np.ndarray)
            return super()._get(*args, **kwargs)

    class SharedReader(original):  # type: ignore[misc]
        def __new__(cls, path: Any, mode: str = "r") -> Any:
            stat = os.stat(path)
            key = (os.path.realpath(path), mode, stat.st_size, stat.st_mtime_ns)
            if key not in sharing.readers:  # not a SharedReader: its __init__ does not run again
                sharing.readers[key] = QuickReader(path, mode)
            return sharing.readers[key]

    return SharedReader
