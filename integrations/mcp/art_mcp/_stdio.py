"""The stdio transport: a server started as a subprocess, one JSON-RPC message per line of its
stdout, its stderr kept in a file so that a crash message can quote it.

Why not the SDK's `stdio_client` as it is: it finds a line by joining everything read since the
last newline to each new chunk and splitting the whole again, which is quadratic in the line's
length; a 50 MB tool result (one line) took over a minute to read and ended as a call timeout
instead of a cut result. Here a line is found in time linear in its length and, as over HTTP, a
message is read whole up to `max_message_bytes`: a longer line fails the session at once, with a
message that names the option, before it can fill the memory. Starting and stopping the process
(its own process group; the spec's shutdown: close stdin, wait, terminate the tree) and draining
its stdout are the SDK's own helpers, so only the reading of lines differs from `stdio_client`.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TextIO

import anyio
import mcp_types
from anyio.abc import ByteReceiveStream
from mcp import StdioServerParameters
from mcp.client import stdio as sdk_stdio
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

# How long the writer may take to flush what the session already sent, at shutdown (the SDK's).
_FLUSH_SECONDS = 0.5


class MessageTooLongError(Exception):
    """A line of the server's stdout over `max_message_bytes`; worded like the SDK's refusal of
    a long HTTP message, so both get the same advice (`_server._server_error`)."""


class StdioTransport:
    """The streams of one session with a server started as `parameters.command`."""

    def __init__(self, parameters: StdioServerParameters, max_message_bytes: int) -> None:
        self.parameters = parameters
        self.max_message_bytes = max_message_bytes
        self.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self.last_stderr = ""

    @contextlib.asynccontextmanager
    async def _streams(self) -> AsyncIterator[TransportStreams]:
        try:
            async with _process_streams(
                self.parameters, self.stderr, self.max_message_bytes
            ) as streams:
                yield streams
        finally:
            self.last_stderr = self.stderr_tail()
            self.stderr.close()

    async def __aenter__(self) -> TransportStreams:
        self._context = self._streams()
        return await self._context.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._context.__aexit__(*exc)

    def stderr_tail(self, chars: int = 800) -> str:
        """The end of what the server wrote to stderr so far (after the session: `last_stderr`)."""
        with contextlib.suppress(ValueError, OSError):
            self.stderr.seek(0)
            return self.stderr.read()[-chars:].strip()
        return ""


@contextlib.asynccontextmanager
async def _process_streams(
    parameters: StdioServerParameters, errlog: TextIO, max_message_bytes: int
) -> AsyncIterator[TransportStreams]:
    command = await sdk_stdio._get_executable_command(parameters.command)
    process = await sdk_stdio._create_platform_compatible_process(
        command=command,
        args=parameters.args,
        env=sdk_stdio.get_default_environment() | (parameters.env or {}),
        errlog=errlog,
        cwd=parameters.cwd,
    )
    # No await until the task group is entered: a cancellation there would leak the process.
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def read_stdout() -> None:
        assert process.stdout is not None
        lines = _lines(process.stdout, max_message_bytes, parameters)
        try:
            async with contextlib.aclosing(lines):
                async for line in lines:
                    await to_session.send(_message(line))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # the session is gone, or our shutdown closed stdout under the read
        # A line too long raised above and skips this: the session must not see a clean end
        # (its request would fail as "connection closed"); the task group's failure tells it why.
        await sdk_stdio._drain_stdout(process)  # a server blocked writing could not exit
        to_session.close()

    async def write_stdin() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for message in from_session:
                    json = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    data = (json + "\n").encode(
                        parameters.encoding, parameters.encoding_error_handler
                    )
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            to_session.close()  # the server stopped reading: end the session, no request hangs
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        try:
            yield read_stream, write_stream
        finally:
            # Shielded and bounded, as the SDK's: a cancelled caller neither leaks the process
            # nor hangs on it.
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(_FLUSH_SECONDS):
                    await writer_done.wait()
                await sdk_stdio._stop_server_process(process)
                for stream in (read_stream, write_stream, to_session, from_session):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


async def _lines(
    stdout: ByteReceiveStream, max_bytes: int, parameters: StdioServerParameters
) -> AsyncGenerator[str, None]:
    """The lines of `stdout`, decoded, each found in time linear in its length and none over
    `max_bytes` (`MessageTooLongError`). A last line with no newline is dropped, as the SDK does."""
    line = bytearray()
    async for chunk in stdout:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line += chunk[start:end]
            _check_length(line, max_bytes)
            yield line.decode(parameters.encoding, parameters.encoding_error_handler)
            line.clear()
            start = end + 1
        line += chunk[start:]
        _check_length(line, max_bytes)


def _check_length(line: bytearray, max_bytes: int) -> None:
    if len(line) > max_bytes:
        raise MessageTooLongError(
            f"A line of the server's stdout exceeded the {max_bytes} byte limit"
        )


def _message(line: str) -> SessionMessage | Exception:
    """One line as the session reads it: a message, or why it is not one (the SDK's sessions
    take an `Exception` on the read stream as a line to skip)."""
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as error:
        return error
    return SessionMessage(message)
