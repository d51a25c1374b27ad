"""One AsyncOpenAI client per event loop and endpoint, kept while its loop runs.

Why shared and kept: an AsyncOpenAI client is a reference cycle (the client and its resources),
so when one is dropped with idle keep-alive connections, the cycle collector runs the sockets'
finalizers, which close their file descriptors while the loop's selector still lists them. New
sockets that reuse those numbers are then never polled, and their requests hang until the read
timeout (600 s by default); measured in a RULER run that made a fresh model per judge setting,
reproduced in tests/core/test_model_client.py. So no client of ours is ever dropped while its loop
runs: models on one endpoint share one pool, and a loop's clients are released only once that
loop is closed (a closed loop's selector is never polled again, so its stale entries are harmless).
"""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI

_Endpoint = tuple[str, str | None]

# id(loop) -> (loop, its clients). The loop is held strongly (its clients' connections hold it
# anyway); entries of closed loops are released on the next call.
_by_loop: dict[int, tuple[asyncio.AbstractEventLoop, dict[_Endpoint, AsyncOpenAI]]] = {}
_outside_a_loop: dict[_Endpoint, AsyncOpenAI] = {}


def shared_client(base_url: str, api_key: str | None) -> AsyncOpenAI:
    """The AsyncOpenAI client for `base_url` and `api_key` on the running event loop."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    for key in [key for key, (old, _) in _by_loop.items() if old.is_closed()]:
        del _by_loop[key]
    clients = _outside_a_loop if loop is None else _by_loop.setdefault(id(loop), (loop, {}))[1]
    endpoint = (base_url, api_key)
    client = clients.get(endpoint)
    if client is None or client.is_closed():
        client = clients[endpoint] = AsyncOpenAI(base_url=base_url, api_key=api_key or "unused")
    return client
