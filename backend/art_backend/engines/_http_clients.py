"""HTTP to the server an engine decodes on (a vLLM server, another art-server): one async client
per event loop, what an error answer says, and a request's start (its queue and its task)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=256)


class LoopClients:
    """An `httpx.AsyncClient` for each event loop that asks (a client belongs to the loop it
    was made on), all with the same base URL and options; streams wait as long as they last."""

    def __init__(self, base_url: str, **options: Any) -> None:
        self.base_url = base_url
        self.options = {"timeout": httpx.Timeout(None), "limits": _LIMITS, **options}
        self._clients: dict[int, httpx.AsyncClient] = {}

    def get(self) -> httpx.AsyncClient:
        """The running loop's client."""
        loop_id = id(asyncio.get_running_loop())
        client = self._clients.get(loop_id)
        if client is None:
            client = httpx.AsyncClient(base_url=self.base_url, **self.options)
            self._clients[loop_id] = client
        return client


def start_request(
    request: Any, metrics: Any, tasks: set[asyncio.Task], run: Callable[[Any], Coroutine]
) -> asyncio.Queue:
    """Count `request` in `metrics`, point its events at a new queue, and run `run(request)` as
    a task of the running loop kept in `tasks` until it ends; the queue."""
    events: asyncio.Queue = asyncio.Queue()
    request._emit = events.put_nowait
    metrics.requests_total += 1
    metrics.prompt_tokens_total += len(request.prompt_ids)
    task = asyncio.get_running_loop().create_task(run(request))
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return events


def error_text(response: httpx.Response) -> str:
    """The message of an error answer (OpenAI's shape, or any JSON), else its text."""
    with contextlib.suppress(ValueError):
        body = response.json()
        error = body.get("error", body) if isinstance(body, dict) else body
        message = error.get("message") if isinstance(error, dict) else None
        if message:
            return str(message)
    return response.text[:300] or f"HTTP {response.status_code}"
