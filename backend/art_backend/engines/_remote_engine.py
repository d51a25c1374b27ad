"""An engine replica on another host: another `art-server --replica-api`, reached over HTTP.

`art-server --replica-url URL` puts one `RemoteEngine` per URL behind its `ReplicaSet`, next to
its own engine: this server keeps the chat template, the records, the trainer and the sticky
routing; the replica decodes (the wire: `_engine_wire`). At start the replica must serve the same
vocabulary (its fingerprint) or the start fails naming both. Each adapter this server serves is
sent to the replica as the folder's two files (`load_adapter`), so the hosts share no disk.

Faults: the set's monitor probes the replica's /health; after three failures in a row it takes
the replica out, which fails its requests in flight (each `FinishEvent` marked `unavailable`:
the client gets a 503 and retries elsewhere) and cancels them here, closing their connections
even when the link is cut and nothing answers. The set takes the replica back once its /health
answers again, after sending it every adapter served meanwhile (`ReplicaSet.check_health`). A
stream that breaks (the replica restarted, the connection reset) finishes its open choices with
an `unavailable` error, the same 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import httpx

from art_backend._errors import EngineStoppedError, InvalidRequestError, ModelLoadError
from art_backend.engines._engine import EngineMetrics, FinishEvent, GenerationRequest
from art_backend.engines._engine_wire import (
    ENGINE_PATH,
    TAR,
    adapter_archive,
    event_from,
    request_body,
    vocabulary_fingerprint,
)
from art_backend.engines._http_clients import LoopClients, error_text, start_request

logger = logging.getLogger("art_backend.remote")

CANCEL_POLL_S = 0.1  # how soon a request cancelled here closes its connection
CONTROL_TIMEOUT_S = 60.0  # one adapter upload or description (a large adapter takes a while)


class RemoteEngine:
    """Implements `Engine` over another art-server's engine routes (see the module doc)."""

    name = "remote"

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        api_key: str | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.start_timeout = start_timeout
        self.metrics = EngineMetrics()
        self.adapters: dict[str, str] = {}  # served name -> the name the replica serves it as
        self.context_length = 0  # the replica's, read at start
        self._vocab_size = 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._control = httpx.Client(
            base_url=self.base_url, headers=self._headers, timeout=CONTROL_TIMEOUT_S
        )
        self._clients = LoopClients(
            self.base_url, headers=self._headers, timeout=httpx.Timeout(None, connect=10.0)
        )
        self._rows = 0
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False

    @property
    def queue_depth(self) -> int:
        return 0  # the replica queues; this side only streams

    @property
    def running_rows(self) -> int:
        return self._rows

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    # ----------------------------------------------------------------------------------- control

    def start(self) -> None:
        """Wait for the replica to answer (it may still be loading), then check its model."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                response = self._control.get(ENGINE_PATH)
            except httpx.HTTPError as error:
                if time.monotonic() > deadline:
                    raise ModelLoadError(
                        f"The engine replica at {self.base_url} did not answer within "
                        f"{self.start_timeout:g} s ({type(error).__name__}: {error}); start it "
                        "with `art-server --replica-api` on that host."
                    ) from error
                time.sleep(0.5)
                continue
            break
        if response.status_code == 404:
            raise ModelLoadError(
                f"{self.base_url} serves no engine routes: start that art-server with "
                "--replica-api."
            )
        if response.status_code != 200:
            raise ModelLoadError(
                f"The engine replica at {self.base_url} answered HTTP {response.status_code}: "
                f"{error_text(response)}"
            )
        described = response.json()
        ours = vocabulary_fingerprint(self.tokenizer)
        if described.get("vocabulary") != ours:
            raise ModelLoadError(
                f"The engine replica at {self.base_url} serves another vocabulary (fingerprint "
                f"{described.get('vocabulary')}, ours {ours}): start it with the same --model."
            )
        self._vocab_size = int(described["vocab_size"])
        self.context_length = int(described["context_length"])

    def stop(self, timeout: float = 30.0) -> None:
        """Stop sending; the replica itself keeps running (it is another host's server)."""
        self._stopping = True
        for task in list(self._tasks):
            with contextlib.suppress(RuntimeError):  # its loop has closed
                task.get_loop().call_soon_threadsafe(task.cancel)
        self._control.close()

    def failure(self) -> str | None:
        """None: the set's health probe decides whether a replica on another host serves."""
        return None

    def load_adapter(self, served_name: str, path: Path) -> None:
        """Send the folder's files; the replica serves them as `served_name` (in place)."""
        archive = adapter_archive(Path(path))
        try:
            response = self._control.put(
                f"{ENGINE_PATH}/adapters/{served_name}",
                content=archive,
                headers={"Content-Type": TAR},
            )
        except httpx.HTTPError as error:
            raise ModelLoadError(
                f"Could not send adapter {served_name!r} to the engine replica at "
                f"{self.base_url}: {type(error).__name__}: {error}"
            ) from error
        if response.status_code == 400:
            raise InvalidRequestError(
                f"The engine replica at {self.base_url} refused adapter {served_name!r}: "
                f"{error_text(response)}",
                param="path",
            )
        if response.status_code != 200:
            raise ModelLoadError(
                f"The engine replica at {self.base_url} did not load adapter {served_name!r} "
                f"(HTTP {response.status_code}): {error_text(response)}"
            )
        self.adapters[served_name] = served_name

    def unload_adapter(self, served_name: str) -> None:
        """Stop serving it here at once; the replica is told (a replica that does not answer
        is told again when it comes back: the set sends it only what it serves then)."""
        self.adapters.pop(served_name, None)
        response = self._control.delete(f"{ENGINE_PATH}/adapters/{served_name}")
        if response.status_code not in (200, 404):
            raise ModelLoadError(
                f"The engine replica at {self.base_url} did not unload {served_name!r} "
                f"(HTTP {response.status_code}): {error_text(response)}"
            )

    # ---------------------------------------------------------------------------------- requests

    def submit(self, request: GenerationRequest) -> asyncio.Queue:
        """Start streaming `request` from the replica; its events arrive on the returned queue."""
        if self._stopping:
            raise EngineStoppedError(f"The engine replica at {self.base_url} was stopped.")
        if request.adapter is not None and request.adapter not in self.adapters:
            raise InvalidRequestError(f"Adapter {request.adapter!r} is not loaded.", param="model")
        return start_request(request, self.metrics, self._tasks, self._run)

    async def _run(self, request: GenerationRequest) -> None:
        emit = request._emit
        assert emit is not None
        open_choices = set(range(request.n))
        self._rows += request.n
        self.metrics.max_batch_size_seen = max(self.metrics.max_batch_size_seen, self._rows)
        started = time.perf_counter()
        reader = asyncio.ensure_future(self._read(request, open_choices))
        error: str | None = None
        try:
            while not reader.done():
                await asyncio.wait({reader}, timeout=CANCEL_POLL_S)
                if request.cancelled and not reader.done():
                    reader.cancel()  # closes the connection: the replica drops the rows
            with contextlib.suppress(asyncio.CancelledError):
                reader.result()
        except asyncio.CancelledError:
            reader.cancel()
            error = "the server in front stopped"
        except Exception as broken:  # noqa: BLE001 - the stream broke: the replica went away
            error = f"the engine replica at {self.base_url} broke off ({broken})"
            logger.warning("%s", error)
            self.metrics.requests_failed += 1
        finally:
            self._rows -= request.n
            self.metrics.busy_seconds_total += time.perf_counter() - started
            if request.cancelled:
                self.metrics.requests_cancelled += 1
            for index in sorted(open_choices):
                emit(_failed(index, request, error))

    async def _read(self, request: GenerationRequest, open_choices: set[int]) -> None:
        emit = request._emit
        assert emit is not None
        client = self._client()
        url = f"{ENGINE_PATH}/generate"
        async with client.stream("POST", url, json=request_body(request)) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"HTTP {response.status_code}: {error_text(response)}")
            async for line in response.aiter_lines():
                if not line:
                    continue
                event = event_from(line)
                if isinstance(event, FinishEvent):
                    open_choices.discard(event.choice_index)
                    self.metrics.generated_tokens_total += len(event.token_ids)
                emit(event)

    def _client(self) -> httpx.AsyncClient:
        return self._clients.get()


def _failed(index: int, request: GenerationRequest, error: str | None) -> FinishEvent:
    """The end of a choice the replica never finished."""
    if request.cancelled and error is None:
        return FinishEvent(index, "cancelled", "", [], [], [])
    return FinishEvent(
        index,
        "error",
        "",
        [],
        [],
        [],
        error=error or "the engine replica closed the stream early",
        unavailable=True,
    )
