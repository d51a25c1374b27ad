"""One AsyncOpenAI client per event loop and endpoint, kept while its loop runs.

Why shared and kept: an AsyncOpenAI client is a reference cycle (the client and its resources),
so when one is dropped with idle keep-alive connections, the cycle collector runs the sockets'
finalizers, which close their file descriptors while the loop's selector still lists them. New
sockets that reuse those numbers are then never polled, and their requests hang until the read
timeout (600 s by default); measured in a RULER run that made a fresh model per judge setting,
reproduced in tests/core/test_model_client.py. So no client of ours is ever dropped while its loop
runs: models on one endpoint share one pool. A loop's clients are closed when the loop shuts down
(`asyncio.run` and pytest close async generators first, so an async generator of ours closes them
while the loop still runs); a loop closed without that has its clients released on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from openai import AsyncOpenAI

_Endpoint = tuple[str, str | None]


class _LoopClients:
    """A running loop's clients, and the async generator that closes them at its shutdown."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.clients: dict[_Endpoint, AsyncOpenAI] = {}
        # Held here: the loop tracks async generators weakly. Started now, so that the loop's
        # shutdown_asyncgens() finds it suspended at its `yield` and runs its `finally`.
        self.closer = self._close_at_shutdown()
        self.started = asyncio.ensure_future(self.closer.__anext__(), loop=loop)

    async def _close_at_shutdown(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            clients, self.clients = list(self.clients.values()), {}
            for client in clients:
                with contextlib.suppress(Exception):
                    await client.close()


# id(loop) -> its clients; entries of closed loops are released on the next call.
_by_loop: dict[int, _LoopClients] = {}
_outside_a_loop: dict[_Endpoint, AsyncOpenAI] = {}


def shared_client(base_url: str, api_key: str | None) -> AsyncOpenAI:
    """The AsyncOpenAI client for `base_url` and `api_key` on the running event loop."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    for key in [key for key, entry in _by_loop.items() if entry.loop.is_closed()]:
        del _by_loop[key]
    if loop is None:
        clients = _outside_a_loop
    else:
        entry = _by_loop.get(id(loop))
        if entry is None or entry.loop is not loop:
            entry = _by_loop[id(loop)] = _LoopClients(loop)
        clients = entry.clients
    endpoint = (base_url, api_key)
    client = clients.get(endpoint)
    if client is None or client.is_closed():
        client = clients[endpoint] = AsyncOpenAI(base_url=base_url, api_key=api_key or "unused")
    return client
