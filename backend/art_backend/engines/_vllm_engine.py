"""The vLLM engine: our serving seam over a managed vLLM server.

Our server stays in front and keeps what makes it ours: it renders the chat template and
tokenizes (vLLM gets prompt token ids, so the ids we record are the ids it ran), records every
completion's prompt, sampled ids and logprobs under its id and rollout, serves `name@step`, parses
tool calls our way, and checks every request before vLLM sees it. vLLM only decodes:
`POST /v1/completions` with the prompt ids, streaming, `return_token_ids` and
`return_tokens_as_token_ids`, our llguidance grammar as `structured_outputs.grammar` (vLLM's
guidance backend runs the same grammar our torch engine enforces), and each adapter loaded at run
time as its own LoRA (`POST /v1/load_lora_adapter`).

Why a child process and not `AsyncLLM` in ours: vLLM wheels pin their own transformers (the CPU
wheel < 5.20), so in-process would hold the whole project to vLLM's pins; and measured on this
CPU, the HTTP hop costs little next to decoding (BENCHMARKS.md, serve_throughput).

Adapters: an unload waits until no request in flight uses the adapter, so a request always
finishes on the adapter it started with. Logprobs are vLLM's raw ones (before temperature, like
ours); under a grammar, vLLM applies the mask before computing them, so forced tokens report the
masked distribution (our torch engine reports the unmasked one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from art_backend._errors import EngineStoppedError, InvalidRequestError, ModelLoadError
from art_backend.engines._adapter_files import check_adapter_folder
from art_backend.engines._constrained import lark_text
from art_backend.engines._engine import (
    EngineMetrics,
    GenerationRequest,
    TokenEvent,
)
from art_backend.engines._http_clients import LoopClients, error_text, start_request
from art_backend.engines._vllm_choice import Chunk, VllmChoice, matched_by_vllm
from art_backend.engines._vllm_process import VllmServer

logger = logging.getLogger("art_backend.vllm")

_TOKEN_ID_PREFIX = "token_id:"
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


class VllmEngine:
    """Implements `Engine` by streaming completions from a vLLM server (see the module doc)."""

    name = "vllm"

    def __init__(
        self,
        process: VllmServer,
        tokenizer: Any,
        *,
        eos_token_ids: list[int],
        context_length: int,
        vocab_size: int,
        adaptable_modules: list[str],
        max_lora_rank: int,
    ) -> None:
        self.process = process
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.context_length = context_length
        self._vocab_size = vocab_size
        self.adaptable_modules = adaptable_modules
        self.max_lora_rank = max_lora_rank
        self.metrics = EngineMetrics()
        self.adapters: dict[str, str] = {}  # served name -> vLLM's LoRA name
        # vLLM's names carry this engine's prefix: two servers may share one vLLM (tests do).
        self._prefix = f"art-{uuid.uuid4().hex[:8]}:"
        self._in_flight: dict[str | None, int] = {}  # adapter -> requests using it now
        self._unload_after: set[str] = set()  # unloaded while in use: unload when idle
        self._adapter_lock = threading.Lock()  # the loop counts uses, the trainer unloads
        self._rows = 0
        self._busy_since: float | None = None
        self._stopping = False
        self._failure_logged = False
        self._tasks: set[asyncio.Task] = set()
        self._clients = LoopClients(process.base_url)
        self._control = httpx.Client(base_url=process.base_url, timeout=600.0)
        self._awake = asyncio.Event()
        self._awake.set()

    # ----------------------------------------------------------------------------------- control

    def start(self) -> None:
        if not self.process.alive():
            self.process.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping = True
        self.process.stop(timeout)
        self._control.close()

    @property
    def queue_depth(self) -> int:
        return 0  # vLLM queues inside; its own /metrics reports vllm:num_requests_waiting

    @property
    def running_rows(self) -> int:
        return self._rows

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    # ---------------------------------------------------------------------------------- adapters

    def load_adapter(self, served_name: str, path: Path) -> None:
        """Load the PEFT folder into vLLM as `served_name` (in place when the name is served)."""
        check_adapter_folder(path, self.adaptable_modules)
        rank = _adapter_rank(path)
        if rank is not None and rank > self.max_lora_rank:
            raise InvalidRequestError(
                f"Adapter {served_name!r} has LoRA rank {rank}, above the vLLM engine's "
                f"--max-lora-rank {self.max_lora_rank}. Restart art-server with "
                f"--max-lora-rank {rank} or train with a smaller lora.r.",
                param="lora.r",
            )
        self._unload_after.discard(served_name)
        lora_name = self._prefix + served_name
        body: dict[str, Any] = {"lora_name": lora_name, "lora_path": str(Path(path).resolve())}
        if served_name in self.adapters:
            body["load_inplace"] = True
        response = self._control.post("/v1/load_lora_adapter", json=body)
        if response.status_code != 200:
            raise ModelLoadError(
                f"vLLM refused adapter {served_name!r} from {path}: {error_text(response)}"
            )
        self.adapters[served_name] = lora_name

    def unload_adapter(self, served_name: str) -> None:
        """Stop serving `served_name`; vLLM frees it once the requests using it are done."""
        with self._adapter_lock:
            self.adapters.pop(served_name)
            if self._in_flight.get(served_name):
                self._unload_after.add(served_name)
                return
        self._unload_now(served_name)

    def _unload_now(self, served_name: str) -> None:
        lora_name = self._prefix + served_name
        response = self._control.post("/v1/unload_lora_adapter", json={"lora_name": lora_name})
        if response.status_code != 200:
            logger.warning("vLLM did not unload %s: %s", lora_name, error_text(response))

    # --------------------------------------------------------------------- GPU sharing (CUDA only)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold new requests, let running ones finish, put vLLM to sleep; wake it afterwards.

        Only with `sleep_mode` (one CUDA GPU shared with the trainer); otherwise does nothing.
        """
        if not self.process.sleep_mode:
            yield
            return
        self._awake.clear()
        try:
            while self._rows:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(self._post_checked, "/sleep", {"level": "1"})
            try:
                yield
            finally:
                await asyncio.to_thread(self._post_checked, "/wake_up", {})
        finally:
            self._awake.set()

    def _post_checked(self, path: str, params: dict[str, str]) -> None:
        response = self._control.post(path, params=params)
        if response.status_code != 200:
            raise ModelLoadError(f"vLLM {path} failed: {error_text(response)}")

    # ---------------------------------------------------------------------------------- requests

    def failure(self) -> str | None:
        """Why vLLM no longer serves (logged once, the first time it is seen), else None."""
        if self._stopping:
            return None
        cause = self.process.exit_cause()
        if cause is not None and not self._failure_logged:
            logger.error("the vLLM engine stopped: %s", cause)
            self._failure_logged = True
        return cause

    def submit(self, request: GenerationRequest) -> asyncio.Queue:
        """Start streaming `request` from vLLM; its events arrive on the returned queue."""
        if self._stopping or not self.process.alive():
            why = self.failure()
            raise EngineStoppedError(
                f"The vLLM engine is not running{f' ({why})' if why else ''}; retry on another "
                "server."
            )
        if request.adapter is not None and request.adapter not in self.adapters:
            raise InvalidRequestError(f"Adapter {request.adapter!r} is not loaded.", param="model")
        with self._adapter_lock:
            self._in_flight[request.adapter] = self._in_flight.get(request.adapter, 0) + 1
        return start_request(request, self.metrics, self._tasks, self._run)

    async def _run(self, request: GenerationRequest) -> None:
        emit = request._emit
        assert emit is not None
        stops = request.params.stop
        ours = bool(stops) and not matched_by_vllm(stops)  # `_vllm_choice`
        choices = [VllmChoice(stops if ours else None) for _ in range(request.n)]
        self._rows += request.n
        self.metrics.max_batch_size_seen = max(self.metrics.max_batch_size_seen, self._rows)
        if self._busy_since is None:
            self._busy_since = time.perf_counter()
        try:
            await self._awake.wait()
            if request.stream_tokens or ours:
                # aclosing: leaving the loop closes the connection now, and vLLM aborts the rest
                async with contextlib.aclosing(self._stream(request, ours)) as stream:
                    async for choice_index, chunk in stream:
                        if request.cancelled:
                            break
                        self._take(chunk, choices[choice_index], choice_index, request)
                        if ours and all(choice.finish_reason is not None for choice in choices):
                            break  # our stops ended every choice: vLLM's sampling is aborted
                        await asyncio.sleep(0)  # a burst of buffered chunks must not hold the loop
            else:
                for chunk in await self._whole(request):
                    index = int(chunk["index"])
                    self._take(chunk, choices[index], index, request)
        except Exception as error:  # noqa: BLE001 - the stream broke: vLLM died or refused it
            logger.warning("vLLM request failed: %s", error)
            self.metrics.requests_failed += 1
            for index, choice in enumerate(choices):
                if choice.finish_reason is None:
                    choice.finish_reason, choice.error = "error", f"vLLM: {error}"
                    emit(choice.finish_event(index))
        finally:
            if request.cancelled:
                self.metrics.requests_cancelled += 1
            for index, choice in enumerate(choices):
                if choice.finish_reason is None:
                    choice.finish_reason = "cancelled" if request.cancelled else "error"
                    choice.error = choice.error or "vLLM closed the stream early"
                    emit(choice.finish_event(index))
            self._release(request)

    def _release(self, request: GenerationRequest) -> None:
        self._rows -= request.n
        if self._rows == 0 and self._busy_since is not None:
            self.metrics.busy_seconds_total += time.perf_counter() - self._busy_since
            self._busy_since = None
        adapter = request.adapter
        with self._adapter_lock:
            self._in_flight[adapter] -= 1
            unload = adapter in self._unload_after and not self._in_flight[adapter]
            if unload:
                self._unload_after.discard(adapter)
        if unload:
            assert adapter is not None
            asyncio.get_running_loop().run_in_executor(None, self._unload_now, adapter)

    def _take(
        self, raw: dict[str, Any], choice: VllmChoice, index: int, request: GenerationRequest
    ) -> None:
        emit = request._emit
        assert emit is not None
        if choice.finish_reason is not None:
            return  # one of our stops ended it: what vLLM sampled after is dropped
        chunk, stopped = choice.add(_chunk(raw), self.tokenizer)
        reason = "stop" if stopped else raw.get("finish_reason")
        for position, (token, value, top) in enumerate(
            zip(chunk.token_ids, chunk.logprobs, chunk.tops, strict=True)
        ):
            top_list = _top_list(top, request.params.top_logprobs)
            choice.token_ids.append(int(token))
            choice.logprobs.append(float(value))
            choice.top_logprobs.append(top_list)
            self.metrics.generated_tokens_total += 1
            if request.stream_tokens:
                last = position == len(chunk.token_ids) - 1
                text = choice.stream_delta(final=reason is not None) if last else ""
                emit(TokenEvent(index, int(token), float(value), top_list, text))
        if reason is not None:
            if reason == "length":
                # vLLM holds back a trailing incomplete UTF-8 character even at the end; the
                # torch engine (and the tokenizer) decode it as U+FFFD. Same ids, same text.
                decoded = self.tokenizer.decode(choice.token_ids, skip_special_tokens=True)
                if decoded.startswith(choice.text):
                    choice.text = decoded
            choice.finish_reason = _FINISH_REASONS.get(reason, "error")
            if choice.finish_reason == "error":
                choice.error = f"vLLM finished with {reason!r}"
            emit(choice.finish_event(index))

    async def _stream(
        self, request: GenerationRequest, our_stops: bool = False
    ) -> AsyncGenerator[tuple[int, dict], None]:
        client = self._client()
        body = self._body(request, our_stops=our_stops)
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"HTTP {response.status_code}: {error_text(response)}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                body = json.loads(line[6:])
                for chunk in body.get("choices") or []:
                    yield int(chunk["index"]), chunk

    async def _whole(self, request: GenerationRequest) -> list[dict[str, Any]]:
        """One non-streaming completion (one JSON body to parse instead of a chunk per token);
        cancelling it closes the connection, which vLLM answers by aborting the request."""
        client = self._client()
        post = asyncio.ensure_future(
            client.post("/v1/completions", json=self._body(request, stream=False))
        )
        while not post.done():
            await asyncio.wait({post}, timeout=0.05)
            if request.cancelled and not post.done():
                post.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await post
                return []
        response = post.result()
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {error_text(response)}")
        return list(response.json().get("choices") or [])

    def _body(
        self, request: GenerationRequest, *, stream: bool = True, our_stops: bool = False
    ) -> dict[str, Any]:
        params = request.params
        body: dict[str, Any] = {
            "model": self._prefix + request.adapter
            if request.adapter
            else self.process.served_name,
            "prompt": request.prompt_ids,
            "n": request.n,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or -1,
            "min_p": params.min_p,
            "repetition_penalty": params.repetition_penalty,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "stream": stream,
            "logprobs": params.top_logprobs,  # 0: the sampled token's logprob only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": self.eos_token_ids,
            "add_special_tokens": False,
        }
        if params.stop and not our_stops:
            body["stop"] = params.stop
        if params.seed is not None:
            body["seed"] = params.seed
        if params.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias.items()}
        if params.grammar is not None:
            body["structured_outputs"] = {"grammar": lark_text(params.grammar)}
        return body

    def _client(self) -> httpx.AsyncClient:
        return self._clients.get()


def _chunk(raw: dict[str, Any]) -> Chunk:
    """A streamed (or whole) choice of vLLM's answer: its tokens, logprobs, top lists, text."""
    token_ids = raw.get("token_ids") or []
    logprobs = raw.get("logprobs") or {}
    values = logprobs.get("token_logprobs") or [0.0] * len(token_ids)
    tops = logprobs.get("top_logprobs") or [None] * len(token_ids)
    return Chunk(token_ids, values, tops, raw.get("text") or "")


def _top_list(top: dict[str, float] | None, k: int) -> list[tuple[int, float]]:
    """vLLM's {"token_id:N": logprob} (sampled token + top k) as our top-k list, best first."""
    if not k or not top:
        return []
    pairs = [(int(key.removeprefix(_TOKEN_ID_PREFIX)), float(value)) for key, value in top.items()]
    pairs.sort(key=lambda pair: -pair[1])
    return pairs[:k]


def _adapter_rank(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, TypeError):
        config = json.loads((Path(path) / "adapter_config.json").read_text())
        ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
        return max(int(rank) for rank in ranks if rank is not None)
    return None
