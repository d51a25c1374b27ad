"""`McpServer`: one MCP server, reached by URL (streamable HTTP), by command (stdio) or in-process,
through one client code path (`mcp.Client` with the initialize handshake, which servers built on
mcp 1.x and 2.x both speak).

Sessions. By default every rollout opens its own session and closes it when it ends: rollouts
are isolated (a stateful server sees one session per run; a crash ends one rollout), at the
cost of a connection per rollout (a new process per rollout over stdio). `pool_size=N` keeps up
to N sessions open and lends one to a rollout at a time: much cheaper per rollout (see
benchmarks/mcp_rollouts.py), with state carried across the rollouts a session serves. The pool
is a queue of N tickets, each an idle session or a free slot to open one in: a rollout takes a
ticket (waiting its turn when none is left) and gives one back, its session, or a free slot if
the session failed (a failed session is closed and replaced, never lent again). A waiter that
is cancelled just as a ticket reaches it passes the ticket on: asyncio's queue does, where a
`Condition` on Python 3.11 dropped that wakeup and left the next waiter hanging beside an idle
session. A rollout either gets a session or fails with `McpServerError`.

Every failure of the server is `McpServerError` (counted as `mcp/failed_rollouts` by
`art_mcp.train`): no connection, no handshake, a timeout, a crash, and also an error or an
invalid answer to a request such as `tools/list`. Only a tool call that the server answers with
an error (bad arguments, the tool failed) is not: the agent sees it and goes on.

Each session lives in a task of its own: the SDK's streams belong to the task that opened them,
so a rollout may call tools from any task (LangGraph branches, a timeout wrapper) safely.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from art_mcp._content import DEFAULT_MAX_RESULT_CHARS, result_text
from art_mcp._errors import McpConfigError, McpServerError
from art_mcp._tools import McpTool, ToolNames, tools_from_listing

T = TypeVar("T")
logger = logging.getLogger("art_mcp")

# One server message (a tool result) is read whole up to this size, over HTTP and stdio alike,
# then cut to `max_result_chars` for the agent; the SDK's own default over HTTP (1 MiB) failed
# the session instead, and over stdio it had no bound.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Error codes of a server that answered: the tool call was wrong, the server is fine.
_TIMEOUT_CODE = -32001
_ANSWERED_CODES = {-32601, -32602, -32603}


@dataclass
class ToolOutcome:
    """What one tool call gave the agent: the tool message text and how it went."""

    text: str
    is_error: bool
    timed_out: bool
    truncated: bool
    seconds: float


class McpServer:
    """An MCP server to train against. Build it with `from_url`, `from_command` or `from_object`.

    Every operation is bounded: the handshake by `connect_timeout`, a tool call by
    `call_timeout` (a timeout the agent sees), everything else (list_tools, resources, prompts)
    by `request_timeout`; a server that does not answer in time fails the rollout with
    `McpServerError`. A tool result is cut to `max_result_chars` for the agent; a message is
    read whole up to `max_message_bytes` first (a longer one fails the session, naming it).
    """

    def __init__(
        self,
        target: Any,
        *,
        label: str,
        call_timeout: float = 30.0,
        connect_timeout: float = 30.0,
        request_timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        pool_size: int = 0,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        headers: dict[str, str] | None = None,
        allowed_tools: Sequence[str] | None = None,
    ) -> None:
        if pool_size < 0:
            raise ValueError(f"pool_size must be >= 0 (0: a session per rollout), got {pool_size}")
        for option, seconds in (
            ("call_timeout", call_timeout),
            ("connect_timeout", connect_timeout),
            ("request_timeout", request_timeout),
        ):
            if not seconds > 0:
                raise ValueError(f"{option} must be a positive number of seconds, got {seconds}")
        self._target = target
        self.label = label
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.max_message_bytes = max_message_bytes
        self.pool_size = pool_size
        self.max_result_chars = max_result_chars
        self._headers = dict(headers or {})
        # Only these tools (MCP names) are offered to the agent: a small model's context is short.
        self.allowed_tools = list(allowed_tools) if allowed_tools is not None else None
        # The pool's tickets: an idle session, or None for a free slot (see the module docstring).
        self._pool: asyncio.LifoQueue[McpSession | None] | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        # One HTTP client per server and event loop: a client per session costs a TLS context.
        self._http: tuple[asyncio.AbstractEventLoop, Any] | None = None
        self._tools: tuple[list[McpTool], ToolNames] | None = None

    def __repr__(self) -> str:
        return f"McpServer({self.label})"

    # ------------------------------------------------------------------------------ construction

    @classmethod
    def from_url(
        cls, url: str, *, headers: dict[str, str] | None = None, **options: Any
    ) -> McpServer:
        """A server over streamable HTTP at `url` (e.g. `http://127.0.0.1:8000/mcp`)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"an MCP server URL starts with http:// or https://, got {url!r}")
        return cls(url, label=url, headers=headers, **options)

    @classmethod
    def from_command(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> McpServer:
        """A server started as a subprocess speaking stdio (`command args...`).

        `env` adds to the SDK's safe default environment (PATH, HOME, ...), it does not replace it.
        """
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment

        parameters = StdioServerParameters(
            command=command,
            args=list(args),
            env={**get_default_environment(), **(env or {})},
            cwd=cwd,
        )
        return cls(parameters, label=" ".join([command, *args]), **options)

    @classmethod
    def from_object(cls, server: Any, **options: Any) -> McpServer:
        """A server object of the mcp SDK (`MCPServer`, or a low-level `Server`) run in-process."""
        name = getattr(server, "name", None) or type(server).__name__
        return cls(server, label=f"in-process {name}", **options)

    # ---------------------------------------------------------------------------------- sessions

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[McpSession]:
        """A session for one rollout: a new one (closed at the end), or one lent by the pool."""
        if not self.pool_size:
            session = await McpSession.open(self)
            try:
                yield session
            finally:
                await session.close()
            return
        session = await self._borrow()
        try:
            yield session
        finally:
            await self._give_back(session)

    async def _borrow(self) -> McpSession:
        pool = self._pool_of_this_loop()
        # Last in, first out: the session given back last is lent first, free slots wait below.
        ticket = await pool.get()
        if ticket is not None and not ticket.broken:
            return ticket
        try:
            if ticket is not None:
                await ticket.close()  # died while idle (its server exited): replace it
            return await McpSession.open(self)
        except BaseException:
            pool.put_nowait(None)  # the slot is free again, for the next in line
            raise

    async def _give_back(self, session: McpSession) -> None:
        if self._pool is None or self._pool_loop is not asyncio.get_running_loop():
            await session.close()  # lent by a pool of another loop, now gone
            return
        if not session.broken:
            self._pool.put_nowait(session)
            return
        try:
            await session.close()
        finally:
            self._pool.put_nowait(None)  # a new session may be opened in its place

    def _pool_of_this_loop(self) -> asyncio.LifoQueue[McpSession | None]:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool_loop is not loop:
            # Sessions belong to the loop that opened them: a new loop starts a new pool.
            self._pool, self._pool_loop = asyncio.LifoQueue(), loop
            for _ in range(self.pool_size):
                self._pool.put_nowait(None)
        return self._pool

    async def close(self) -> None:
        """Close the pooled sessions and the shared HTTP client (both are per event loop)."""
        pool = self._pool
        if pool is not None:
            idle = [pool.get_nowait() for _ in range(pool.qsize())]
            for session in idle:
                try:
                    if session is not None:
                        await session.close()
                finally:
                    pool.put_nowait(None)  # the pool stays usable: a slot to open a new one in
        if self._http is not None:
            http, self._http = self._http, None
            with contextlib.suppress(Exception):
                await http[1].aclose()

    async def __aenter__(self) -> McpServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --------------------------------------------------------------------------------- discovery

    async def list_tools(self, *, refresh: bool = False) -> list[McpTool]:
        """The server's tools, with the names the model sees (`.openai_name`); cached."""
        return (await self._tool_listing(refresh))[0]

    async def tool_names(self) -> ToolNames:
        """The reversible map between the model's tool names and the server's."""
        return (await self._tool_listing(False))[1]

    async def _tool_listing(self, refresh: bool) -> tuple[list[McpTool], ToolNames]:
        if self._tools is None or refresh:
            async with self.session() as session:
                listed = await session.request(_all_tools, what="list_tools")
            if self.allowed_tools is not None:
                unknown = set(self.allowed_tools) - {tool.name for tool in listed}
                if unknown:
                    raise McpConfigError(
                        f"allowed_tools names tools {sorted(unknown)} that {self.label} does not "
                        f"have; its tools are {sorted(tool.name for tool in listed)}"
                    )
                listed = [tool for tool in listed if tool.name in self.allowed_tools]
            self._tools = tools_from_listing(listed, reserved={"complete_task"})
            for mcp_name, openai_name in self._tools[1].collisions:
                logger.warning(
                    "%s: tool %r is offered to the model as %r (its name, made valid for "
                    "OpenAI, collided with another tool's)",
                    self.label,
                    mcp_name,
                    openai_name,
                )
        return self._tools

    async def list_resources(self) -> list[Any]:
        """The server's resources (SDK `Resource` objects: `.uri`, `.name`, `.description`)."""
        async with self.session() as session:
            return await session.request(
                _list_or_empty("list_resources", "resources"), what="list_resources"
            )

    async def read_resource(self, uri: str) -> str:
        """A resource's text contents (blobs as placeholders), joined."""
        async with self.session() as session:
            result = await session.request(
                lambda client: client.read_resource(uri), what=f"read_resource {uri}"
            )
        return "\n".join(
            getattr(c, "text", None) or f"[{c.mime_type}: binary]" for c in result.contents
        )

    async def list_prompts(self) -> list[Any]:
        """The server's prompts (SDK `Prompt` objects: `.name`, `.description`, `.arguments`)."""
        async with self.session() as session:
            return await session.request(
                _list_or_empty("list_prompts", "prompts"), what="list_prompts"
            )

    def _client(self) -> Any:
        """A new `mcp.Client` for this server (one per session)."""
        import mcp

        target = self._target
        if isinstance(target, str):
            from mcp.client.streamable_http import streamable_http_client

            connect = functools.partial(
                streamable_http_client, max_sse_event_size=self.max_message_bytes
            )
            target = _HttpTransport(target, self._http_client(), connect)
        elif isinstance(target, mcp.StdioServerParameters):
            from art_mcp._stdio import StdioTransport

            target = StdioTransport(target, self.max_message_bytes)
        return mcp.Client(target, mode="legacy", cache=None)

    def _http_client(self) -> Any:
        """The shared HTTP client of this event loop (headers applied); the SDK leaves a client
        it is given open, so sessions share it and `close()` closes it."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http[0] is not loop:
            from mcp.shared._httpx_utils import create_mcp_http_client

            self._http = (loop, create_mcp_http_client(headers=self._headers))
        return self._http[1]


class McpSession:
    """One open MCP session, owned by a task of its own; `request(fn)` runs `fn(client)` there."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.broken = False
        self._jobs: asyncio.Queue[tuple[Callable[[Any], Awaitable[Any]], asyncio.Future] | None]
        self._jobs = asyncio.Queue()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._client: Any = None  # the SDK's client, once the owner made it

    @classmethod
    async def open(cls, server: McpServer) -> McpSession:
        """Connect (within the server's connect timeout) or raise `McpServerError`."""
        session = cls(server)
        session._task = asyncio.create_task(session._own())
        try:
            await asyncio.wait_for(asyncio.shield(session._ready), server.connect_timeout)
        except TimeoutError:
            await session.close()
            raise McpServerError(
                f"MCP server {server.label}: no answer to the handshake within "
                f"{server.connect_timeout:.0f} s (connect_timeout). Is it running, and is this "
                "its MCP endpoint?"
            ) from None
        except BaseException:  # the handshake failed, or the caller gave up on it
            await session.close()
            raise
        return session

    async def _own(self) -> None:
        client = self._client = self.server._client()
        try:
            async with client:
                self._ready.set_result(None)
                while (job := await self._jobs.get()) is not None:
                    fn, future = job
                    try:
                        result = await fn(client)
                    except Exception as error:  # noqa: BLE001 - handed to the caller
                        if not future.done():
                            future.set_exception(error)
                    else:
                        if not future.done():
                            future.set_result(result)
        except BaseException as error:  # the connection itself failed (or we were cancelled)
            failure = _server_error(self.server, error, getattr(client.server, "last_stderr", ""))
            if not self._ready.done():
                self._ready.set_exception(failure)
            self._fail_pending(failure)
            if isinstance(error, asyncio.CancelledError):
                raise
        finally:
            self.broken = True
            self._fail_pending(McpServerError(f"MCP server {self.server.label}: session closed."))

    def _fail_pending(self, failure: McpServerError) -> None:
        for future in self._pending:
            if not future.done():
                future.set_exception(failure)

    async def request(
        self,
        fn: Callable[[Any], Awaitable[T]],
        timeout: float | None = None,
        *,
        what: str = "a request",
        option: str = "request_timeout",
        caller_handles: tuple[type[Exception], ...] = (),
    ) -> T:
        """Run `fn(client)` in the session's task, within `timeout` (default: the server's
        `request_timeout`). Any failure (no answer in time, an error answer, one that is not
        valid MCP, a lost connection) is `McpServerError` and breaks the session, but for the
        exceptions the caller handles itself (`call_tool`: a tool's own errors)."""
        timeout = self.server.request_timeout if timeout is None else timeout
        if self.broken:
            raise McpServerError(f"MCP server {self.server.label}: the session is closed.")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.add(future)
        self._jobs.put_nowait((fn, future))
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            self.broken = True  # the owner is stuck on this job: never lend this session again
            future.cancel()  # nobody reads it now: a late failure must not be logged as unread
            raise McpServerError(
                f"MCP server {self.server.label}: no answer to {what} within {timeout:g} s "
                f"({option}); the session is abandoned. Is the server hung?"
            ) from None
        except McpServerError:
            raise
        except caller_handles:
            raise
        except Exception as error:
            self.broken = True  # never lend a session whose server failed a request
            raise _request_error(self.server, what, error, _stderr_tail(self._client)) from error
        finally:
            self._pending.discard(future)

    async def call_tool(self, tool: McpTool, arguments: dict[str, Any]) -> ToolOutcome:
        """Call one tool. A tool error or a timeout is an outcome the agent sees; a dead server
        raises `McpServerError`."""
        from mcp import MCPError

        server = self.server
        started = time.perf_counter()
        try:
            result = await self.request(
                lambda client: client.call_tool(
                    tool.name, arguments, read_timeout_seconds=server.call_timeout
                ),
                timeout=server.call_timeout + 10,  # the SDK's own timeout answers first
                what=f"the call of {tool.name}",
                option="call_timeout + 10",
                caller_handles=(MCPError,),
            )
        except MCPError as error:
            seconds = time.perf_counter() - started
            if error.error.code == _TIMEOUT_CODE:
                text = f"Tool error: {tool.openai_name} did not answer within {server.call_timeout:g} s."
                return ToolOutcome(text, True, True, False, seconds)
            if error.error.code in _ANSWERED_CODES:
                return ToolOutcome(
                    f"Tool error: {error.error.message}", True, False, False, seconds
                )
            self.broken = True
            raise _server_error(server, error, None) from error
        text, truncated = result_text(result, server.max_result_chars)
        return ToolOutcome(
            text, bool(result.is_error), False, truncated, time.perf_counter() - started
        )

    async def close(self) -> None:
        """End the session: an open one waits a little for a clean goodbye, then is cancelled;
        one still in its handshake is cancelled at once (nobody waits for it any more)."""
        if self._task is None or self._task.done():
            return
        if not self._ready.done():
            # Before the owner fails it: a failure nobody reads would be logged by asyncio as
            # "Future exception was never retrieved" (`open` stopped waiting on a timeout).
            self._ready.cancel()
        else:
            self._jobs.put_nowait(None)
            with contextlib.suppress(BaseException):  # a hung or failed goodbye: cancel below
                await asyncio.wait_for(asyncio.shield(self._task), 5)
                return
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


# ---------------------------------------------------------------------------------- transports


class _HttpTransport:
    """streamable_http_client on the server's shared httpx2 client (which carries the headers)."""

    def __init__(self, url: str, http: Any, connect: Callable[..., Any]):
        self.url, self._http, self._connect = url, http, connect

    async def __aenter__(self) -> Any:
        self._context = self._connect(self.url, http_client=self._http)
        return await self._context.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._context.__aexit__(*exc)


def _server_error(
    server: McpServer, error: BaseException, stderr: str | None, *, during: str | None = None
) -> McpServerError:
    """A clear message for a failed connection, whatever the SDK raised (groups included)."""
    if isinstance(error, McpServerError):
        return error
    leaves = list(_leaf_exceptions(error))
    reason = "; ".join(f"{type(e).__name__}: {e}" for e in leaves[:3]) or type(error).__name__
    transport = getattr(server._target, "command", None)
    hint = (
        "Check the command runs on its own (it must speak MCP on stdin/stdout)."
        if transport
        else "Check the server is running and the URL is its MCP endpoint (often .../mcp)."
    )
    if "byte limit" in reason:  # one message (a tool result) refused: SSE's reader, or ours
        hint = (
            f"A message was over max_message_bytes ({server.max_message_bytes} bytes): raise "
            "it, or make the tool return less."
        )
    failed = f"failed during {during}" if during else "failed"
    message = f"MCP server {server.label} {failed}: {reason.rstrip('.')}. {hint}"
    if stderr:
        message += f"\nIts stderr ends with:\n{stderr}"
    return McpServerError(message)


def _request_error(server: McpServer, what: str, error: Exception, stderr: str) -> McpServerError:
    """A clear message for a request the server failed: an error for an answer, an answer that
    is not valid MCP, or none (the connection closed: a crash)."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED
    from pydantic import ValidationError

    if isinstance(error, MCPError) and error.error.code != CONNECTION_CLOSED:
        message = (
            f"MCP server {server.label} answered {what} with an error ({error.error.code}: "
            f"{error.error.message.rstrip('.')}). The rollout cannot go on without it: look for "
            f"the cause in the server's log, and check that {what} works in another MCP client "
            "(e.g. the MCP Inspector)."
        )
    elif isinstance(error, ValidationError):
        problems = "; ".join(
            f"{'.'.join(map(str, problem['loc'])) or 'result'}: {problem['msg']}"
            for problem in error.errors()[:3]
        )
        message = (
            f"MCP server {server.label} answered {what} with a result that is not valid MCP "
            f"({problems}). The server breaks the protocol: update its MCP SDK, or fix what it "
            "returns."
        )
    else:
        return _server_error(server, error, stderr, during=what)
    if stderr:
        message += f"\nIts stderr ends with:\n{stderr}"
    return McpServerError(message)


def _stderr_tail(client: Any) -> str:
    """The end of a stdio server's stderr, to quote in a failure ('' for other transports)."""
    transport: Any = getattr(client, "server", None)
    if not hasattr(transport, "stderr_tail"):
        return ""
    return str(transport.last_stderr or transport.stderr_tail())


def _leaf_exceptions(error: BaseException) -> Any:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaf_exceptions(inner)
    else:
        yield error


async def _all_tools(client: Any) -> list[Any]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def _list_or_empty(method: str, field: str) -> Callable[[Any], Awaitable[list[Any]]]:
    """A listing that is empty when the server does not offer that capability."""

    async def fetch(client: Any) -> list[Any]:
        capabilities = client.server_capabilities
        if getattr(capabilities, field, None) is None:
            return []
        return list(getattr(await getattr(client, method)(), field))

    return fetch
