"""`json.loads` in a child process, for request bodies whose parse would hold the interpreter lock
longer than other clients can wait.

`json.loads` is one C call: whatever thread runs it, no other thread runs Python until it returns.
Decoding escapes is its slow part (here about 32 ms per million; a plain 28 MB string parses in
28 ms), so a body of 28 MB of `\\",` escapes held every route, `/health` included, for 0.3 s
(issue 43). Bodies with more than `ESCAPES_FOR_A_CHILD` backslashes are parsed in a child process
instead, whose lock is its own; the caller's thread waits with the lock released, and only the
result's unpickling (a string copied, at most `_limits.MAX_JSON_VALUES` values) runs here.

The child is an interpreter that imports the standard library only (started at the first such
body, kept, stopped at exit). If it cannot answer (killed, out of memory), the body is parsed
here as before: slower for others, never wrong.
"""

from __future__ import annotations

import atexit
import json
import logging
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, Any

logger = logging.getLogger("art_backend.limits")

# About 32 ms of json.loads on this machine's core: below it the hand-off costs more than it saves.
ESCAPES_FOR_A_CHILD = 1_000_000
_SIZE = struct.Struct("<Q")

# The child: read a length-prefixed body, answer a length-prefixed pickle of json.loads' result
# or failure, repeat. Python without site-packages (-I -S): it needs the standard library only,
# and starts in milliseconds (multiprocessing's spawn would import the server's main module).
_CHILD = """
import json, pickle, struct, sys
size, read, write = struct.Struct("<Q"), sys.stdin.buffer.read, sys.stdout.buffer.write
while header := read(8):
    body = read(size.unpack(header)[0])
    try:
        answer = "ok", json.loads(body)
    except RecursionError as error:
        answer = "recursion", str(error)
    except json.JSONDecodeError as error:
        answer = "json", (error.msg, error.doc[: error.pos], error.pos)
    except UnicodeDecodeError:
        answer = "unicode", None
    except ValueError as error:
        answer = "value", str(error)
    data = pickle.dumps(answer, protocol=5)
    write(size.pack(len(data)) + data)
    sys.stdout.buffer.flush()
"""


def loads(body: bytes) -> Any:
    """`json.loads(body)`, with its exceptions, in a child process when `body` holds more than
    `ESCAPES_FOR_A_CHILD` backslashes; here otherwise."""
    if body.count(b"\\") <= ESCAPES_FOR_A_CHILD:
        return json.loads(body)
    try:
        kind, value = _child.parse(body)
    except (OSError, EOFError, pickle.UnpicklingError, struct.error) as error:
        logger.warning("JSON child process failed (%s); parsing here", error)
        _child.stop()
        return json.loads(body)
    if kind == "ok":
        return value
    # The parse failed in the child: fail the same way here, with the same message.
    if kind == "recursion":
        raise RecursionError(value)
    if kind == "json":
        message, text, position = value
        raise json.JSONDecodeError(message, text, position)
    if kind == "unicode":
        return json.loads(body)  # decoding fails before parsing starts: raised here as it is
    raise ValueError(value)


class _Child:
    """One child at a time, started at its first body, stopped at exit; a body waits its turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def parse(self, body: bytes) -> tuple[str, Any]:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _CHILD],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            assert self._process.stdin is not None and self._process.stdout is not None
            self._process.stdin.write(_SIZE.pack(len(body)) + body)
            self._process.stdin.flush()
            (size,) = _SIZE.unpack(_read(self._process.stdout, _SIZE.size))
            answer: tuple[str, Any] = pickle.loads(_read(self._process.stdout, size))
            return answer

    def stop(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


def _read(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError(f"the JSON child process answered {len(data)} of {size} bytes")
    return data


_child = _Child()
atexit.register(_child.stop)
