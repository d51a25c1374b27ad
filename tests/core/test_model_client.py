"""`Model.openai_client()`: one connection pool per endpoint and event loop, never dropped mid-run.

An AsyncOpenAI client that is garbage-collected while its loop runs closes its pooled sockets
from finalizers, leaving their file descriptors registered in the loop's selector; the next
sockets that reuse those numbers are never polled, and their requests hang until the read
timeout (found in a RULER benchmark that made a fresh model per run). Our clients are shared per
loop and endpoint, so dropping a model never drops a live client.
"""

from __future__ import annotations

import asyncio
import gc

import art_core as art
from tests.support.servers import RunningServer


async def _burst(model: art.Model, n: int) -> list[object]:
    client = model.openai_client()

    async def one() -> object:
        return await client.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            timeout=20,
        )

    return await asyncio.gather(*[one() for _ in range(n)], return_exceptions=True)


async def test_a_dropped_model_does_not_stall_the_next_models_requests(server: RunningServer):
    failures: list[BaseException] = []
    gc.disable()  # collect at the worst moment, not at a random one
    try:
        for _ in range(4):
            first = art.Model(name="tiny", base_url=f"{server.url}/v1")
            assert not [r for r in await _burst(first, 16) if isinstance(r, BaseException)]
            del first  # its idle keep-alive connections go with it, unless the pool is shared
            second = art.Model(name="tiny", base_url=f"{server.url}/v1")
            pending = asyncio.ensure_future(_burst(second, 16))
            await asyncio.sleep(0.01)
            gc.collect()
            results = await pending + await _burst(second, 16)
            failures += [r for r in results if isinstance(r, BaseException)]
    finally:
        gc.enable()
    assert not failures, f"{len(failures)} requests failed, first: {failures[0]!r}"


async def test_models_on_one_endpoint_share_one_pool_and_options_share_it_too(
    server: RunningServer,
):
    a = art.Model(name="tiny", base_url=f"{server.url}/v1")
    b = art.Model(name="other", base_url=f"{server.url}/v1")
    assert a.openai_client() is b.openai_client()
    assert a.openai_client(timeout=5)._client is a.openai_client()._client
    assert a.openai_client(timeout=5).timeout == 5
    c = art.Model(name="tiny", base_url=f"{server.url}/v1", api_key="another-key")
    assert c.openai_client() is not a.openai_client()


def test_each_event_loop_gets_its_own_client(server: RunningServer):
    model = art.Model(name="tiny", base_url=f"{server.url}/v1")

    async def client() -> object:
        return model.openai_client()

    first, second = asyncio.run(client()), asyncio.run(client())
    assert first is not second
    # closed while their loop shut down, not left for the garbage collector
    assert first.is_closed() and second.is_closed()
    assert model.openai_client() is model.openai_client()  # outside a loop: one client too
