"""The torch engine: one base model, LoRA adapters, continuous batching with a KV cache.

A single engine thread owns the model. Requests arrive on a queue; between two decode steps the
thread admits new requests (prefilled together, then merged into the running batch by padding
the KV cache on the left) and drops finished ones (their rows are removed from the cache). Every
row carries its own adapter name, sampling settings, generator and grammar, so one batch mixes
`base`, `name@3` and `name@4` without a second copy of the base weights (PEFT mixed-adapter
forward). A failure while handling one row finishes that row with an error; the others go on.

Sampling is batched on the logits' device (`_sampling.py`), one host copy per step. The cache is
ours, not transformers' per-layer-type one: every attention layer keeps every token
and sliding windows come from the mask (`_kv_cache.py` has the table of cache layer types, which
it serves and which it refuses at `start`, by family). docs/models.md lists the tested families.
`ART_DECODE_STEP=static` keeps the rows in the slots of a preallocated cache instead of padding
them (`_decode_rows.py`: the layouts behind one set of calls); `compiled` compiles its steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from art_backend._errors import EngineStoppedError, InvalidRequestError
from art_backend.engines._adapter_files import (
    adaptable_modules,
    linear_shapes,
)
from art_backend.engines._admission import admit_window, next_request
from art_backend.engines._compiled_step import CompiledStep, compiled_step
from art_backend.engines._constrained import mask_rows
from art_backend.engines._decode_rows import DecodeRows, DynamicRows, decode_rows
from art_backend.engines._engine import (
    EngineMetrics,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
)
from art_backend.engines._kv_cache import cache_keyword, check_servable, engine_cache
from art_backend.engines._loop_calls import LoopCalls
from art_backend.engines._prefill_groups import prefill_groups
from art_backend.engines._running_choice import RunningChoice
from art_backend.engines._sampling import (
    SampledBatch,
    make_generator,
    processed_logits,
    sample_batch,
)
from art_backend.engines._switches import env_switch
from art_backend.engines._text import decode_increment
from art_backend.engines._threads import ThreadGovernor
from art_backend.engines._torch_adapters import AdapterSlots

logger = logging.getLogger("art_backend.engine")

BASE_ADAPTER = "__base__"  # PEFT's name for "no adapter" in a mixed batch
_WAKE = object()  # on the request queue: a call waits for the engine thread


class TorchEngine(AdapterSlots):
    """Owns the model on one thread; `submit` is safe to call from any thread or event loop.

    Implements the serving seam (`Engine`) and the colocated-training one (`TrainableEngine`).
    """

    name = "torch"

    def __init__(
        self,
        model: Any,  # a transformers causal LM (a PeftModel once an adapter is loaded)
        tokenizer: Any,
        *,
        eos_token_ids: list[int],
        context_length: int,
        max_batch_size: int = 128,
        max_batch_tokens: int = 65536,
        threads: ThreadGovernor | None = None,
    ) -> None:
        self.model: Any = model
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.context_length = context_length
        self.max_batch_size = max_batch_size
        # Rows x (prompt + max new tokens): what the batch's KV cache may come to hold.
        self.max_batch_tokens = max_batch_tokens
        self.device = next(model.parameters()).device
        self._config = model.config
        self._cache_keyword = cache_keyword(model)
        self.metrics = EngineMetrics()
        # ART_ENGINE_PROFILE=1: on a GPU, wait for each forward so that /metrics splits a decode
        # step exactly between the forward and sampling (one more synchronisation a step).
        self._profile = env_switch("ART_ENGINE_PROFILE", default=False)
        self._admit_window = admit_window()  # an idle engine's wait for a burst (`_admission`)
        # On a CPU: torch's thread count follows the cores other processes leave idle.
        self.threads = threads
        self.adapters: dict[str, str] = {}  # served name -> PEFT adapter name
        # What a LoRA's target_modules may name; read once, before any adapter wraps a layer.
        self.adaptable_modules = adaptable_modules(model)
        self._linear_shapes = linear_shapes(model)  # what a served adapter's weights must fit
        self._adapter_counter = itertools.count()
        self._init_adapter_slots()
        self._pending: queue.Queue[Any] = queue.Queue()  # requests, and _WAKE
        # The trainer's model work, on this thread on a CPU (`_loop_calls.py`: why).
        self._calls = LoopCalls(wake=lambda: self._pending.put(_WAKE))
        self._lock = threading.Lock()  # guards adapter changes against the decode loop
        self._exclusive_waiters = 0  # threads waiting in exclusive(): the loop yields to them
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="art-engine", daemon=True)
        self._batch: list[RunningChoice] = []
        # The rows' KV cache, left-padded or in slots (ART_DECODE_STEP, read at start).
        self._rows: DecodeRows = DynamicRows(self.device)
        self._compiled: CompiledStep | None = None  # ART_DECODE_STEP=compiled
        self._next_tokens: Any = None  # tensor of the tokens to feed at the next decode step

    # ----------------------------------------------------------------------------------- control

    def start(self) -> None:
        """Start the engine thread; a model whose cache layers it cannot batch is refused first."""
        check_servable(self._config)
        self._compiled = compiled_step(self.model, self._cache_keyword, self.device, self.metrics)
        self._rows = decode_rows(self.model, self.tokenizer.pad_token_id or 0, self.device)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish in-flight work, fail what is still queued, and join the thread."""
        self._stopping = True
        if self._thread.ident is not None:  # refused at start: never ran
            self._thread.join(timeout)
        if self.threads is not None:
            self.threads.stop()

    def failure(self) -> str | None:
        """Why the engine thread no longer serves, else None."""
        if self._thread.ident is not None and not self._thread.is_alive() and not self._stopping:
            return "the torch engine's thread has stopped (see the server log for its error)"
        return None

    @property
    def queue_depth(self) -> int:
        """Requests waiting to be admitted into the batch."""
        return self._pending.qsize()

    @property
    def running_rows(self) -> int:
        """Rows (choices) currently in the decode batch."""
        return len(self._batch)

    @property
    def vocab_size(self) -> int:
        """Size of the model's output vocabulary."""
        return int(self._config.vocab_size)

    # ------------------------------------------- the model between two steps (adapters: AdapterSlots)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Any]:
        """Hold the model between two decode steps (a trainer's micro-batch); yields the model.

        The decode loop yields to a waiting caller after its current step, so generation pauses
        for the length of one micro-batch instead of starving the trainer.
        """
        self._exclusive_waiters += 1  # one trainer at a time: the training queue serialises them
        try:
            self._lock.acquire()
        finally:
            self._exclusive_waiters -= 1
        try:
            if self.threads is not None:
                self.threads.apply()  # in the trainer's thread, as the decode loop does in its own
            yield self.model
        finally:
            self._lock.release()

    # ---------------------------------------------------------------------------------- requests

    def submit(self, request: GenerationRequest) -> asyncio.Queue:
        """Queue a request; events for it arrive on the returned asyncio queue (this loop's)."""
        if self._stopping:
            raise EngineStoppedError("The engine is shutting down; retry on another server.")
        if request.adapter is not None and request.adapter not in self.adapters:
            raise InvalidRequestError(f"Adapter {request.adapter!r} is not loaded.", param="model")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        request._emit = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)
        self.metrics.requests_total += 1
        self.metrics.prompt_tokens_total += len(request.prompt_ids)
        self._pending.put(request)
        return events

    # ------------------------------------------------------------------------------ engine thread

    def run_between_steps(self, function: Any) -> bool:
        """Run `function()` on the engine thread between two decode steps (on a CPU; it
        settles its own result); False where it cannot: run it elsewhere."""
        return self._calls.submit(function)

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cpu":
            self._calls.open()
        try:
            self._loop()
        finally:
            self._calls.close()

    def _loop(self) -> None:
        while True:
            self._calls.run_pending()
            if self._stopping and not self._batch and self._pending.empty():
                return
            new_requests = self._take_pending(block=not self._batch)
            if self.threads is not None:
                self.threads.apply()
            started = time.perf_counter()
            with self._lock, torch.inference_mode():
                try:
                    if new_requests:
                        self._admit(new_requests)
                    self._drop_finished()
                    if self._batch:
                        self._decode_step()
                        self._drop_finished()
                except Exception as error:
                    logger.exception("engine step failed")
                    self._fail_everything(new_requests, f"engine step failed: {error}")
            if new_requests or self._batch:
                self.metrics.busy_seconds_total += time.perf_counter() - started
            while self._exclusive_waiters:  # a trainer waits for the model: let it in
                time.sleep(0.001)

    def _take_pending(self, *, block: bool) -> list[GenerationRequest]:
        """Requests to admit now: as many as fit in the free rows and the free KV tokens; idle,
        those arriving within the admission window too (`_admission.py`). A request that does
        not fit waits; the batch never exceeds max_batch_size rows or max_batch_tokens tokens
        unless one request alone asks for more (it then runs alone)."""
        taken: list[GenerationRequest] = []
        free_rows = self.max_batch_size - len(self._batch)
        free_tokens = self.max_batch_tokens - sum(self._kv_tokens(s.request) for s in self._batch)
        if block:
            try:
                first = self._pending.get(timeout=0.05)
            except queue.Empty:
                return []
            if first is _WAKE:  # a call for this thread (`run_between_steps`)
                return []
            taken.append(first)
            free_rows -= taken[0].n
            free_tokens -= taken[0].n * self._kv_tokens(taken[0])
        deadline = time.monotonic() + (self._admit_window if block else 0.0)
        while free_rows > 0 and free_tokens > 0:
            request = next_request(self._pending, deadline)
            if request is None:
                break
            if request is _WAKE:
                continue
            taken.append(request)
            free_rows -= request.n
            free_tokens -= request.n * self._kv_tokens(request)
        # Over the bounds: the newest go back to the queue, all of them while a batch runs (an
        # oversized request waits for the batch to drain, then runs alone).
        while len(taken) > (0 if self._batch else 1) and (free_rows < 0 or free_tokens < 0):
            free_rows += taken[-1].n
            free_tokens += taken[-1].n * self._kv_tokens(taken[-1])
            self._requeue_front(taken.pop())
        return taken

    def _kv_tokens(self, request: GenerationRequest) -> int:
        """The most tokens one row of `request` can hold in the KV cache."""
        return min(len(request.prompt_ids) + request.params.max_new_tokens, self.context_length)

    def _requeue_front(self, request: GenerationRequest) -> None:
        with self._pending.mutex:
            self._pending.queue.appendleft(request)
            self._pending.not_empty.notify()

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
        adapters: list[str],
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        scope: Any = contextlib.nullcontext()
        if self._is_peft:
            if len(set(adapters)) > 1:  # PEFT routes each row through its own adapter (or none)
                kwargs["adapter_names"] = adapters
            elif adapters[0] == BASE_ADAPTER:
                scope = self._adapters_off()
            elif self.model.active_adapter != adapters[0]:
                # One adapter for the whole batch: PEFT's plain LoRA forward, much cheaper per
                # step than the mixed-batch path (train_step generation 12.1 s -> 10.6 s, SmolLM2).
                self.model.set_adapter(adapters[0])
        inputs = {
            "input_ids": input_ids.to(self.device),
            "attention_mask": _on_device(attention_mask, self.device),
            "position_ids": position_ids.to(self.device),
        }
        with scope:
            if self._compiled and self._compiled.runs(cache, None if kwargs else adapters[0]):
                return self._compiled(self.model, adapters[0], cache=cache, **inputs)
            cache_input = {self._cache_keyword: cache}
            output = self.model(**inputs, use_cache=True, logits_to_keep=1, **cache_input, **kwargs)
        return output.logits[:, -1, :].float()  # stays on the device: sampling happens there

    def _admit(self, requests: list[GenerationRequest]) -> None:
        """Prefill new requests in groups of similar prompt lengths (`_prefill_groups.py`),
        sample their first tokens, merge them into the batch."""
        live = [r for r in requests if not r.cancelled]
        for request in requests:
            if request.cancelled:
                self._finish_request_early(request, "cancelled", None)
        for group in prefill_groups(live):
            self._admit_together(group)

    def _admit_together(self, live: list[GenerationRequest]) -> None:
        """Prefill `live` in one forward (left-padded), sample, merge."""
        # A GRPO group's rollouts send the same prompt at the same moment: each distinct prompt
        # (and adapter) is prefilled once, and its cache row is repeated for every request and
        # choice that asked for it, as for the n choices of one request.
        distinct: dict[tuple[str | None, tuple[int, ...]], int] = {}
        prompt_rows = [
            distinct.setdefault((request.adapter, tuple(request.prompt_ids)), len(distinct))
            for request in live
        ]
        prompts = list(
            {row: request for row, request in zip(prompt_rows, live, strict=True)}.values()
        )
        try:
            logits, cache, mask = self._prefill(prompts)
        except Exception as error:
            if len(live) == 1:
                logger.exception("prefill failed")
                self._finish_request_early(live[0], "error", f"prefill failed: {error}")
                return
            for request in live:
                self._admit_together([request])
            return
        self.metrics.prefill_batches_total += 1
        self.metrics.prefill_shared_requests_total += len(live) - len(prompts)
        rows: list[int] = []
        sequences: list[RunningChoice] = []
        for row, request in zip(prompt_rows, live, strict=True):
            try:
                choices = self._new_sequences(request)
            except Exception as error:
                logger.exception("could not start a request")
                self._finish_request_early(request, "error", f"could not start: {error}")
                continue
            sequences.extend(choices)
            rows.extend([row] * len(choices))
        if not sequences:
            return
        row_index = torch.tensor(rows)
        cache.batch_select_indices(row_index)
        mask = mask[row_index]
        next_tokens = self._sample_rows(logits[row_index.to(logits.device)], sequences)
        self._merge(sequences, cache, mask, next_tokens)

    def _new_sequences(self, request: GenerationRequest) -> list[RunningChoice]:
        sequences = []
        for choice_index in range(request.n):
            seed = None if request.params.seed is None else request.params.seed + choice_index
            constraint = request.constraint_factory() if request.constraint_factory else None
            sequences.append(
                RunningChoice(
                    request=request,
                    choice_index=choice_index,
                    generator=make_generator(seed, self.device),
                    constraint=constraint,
                    length=len(request.prompt_ids),
                )
            )
        return sequences

    @property
    def _is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    def _peft_adapter(self, served_name: str | None) -> str:
        return BASE_ADAPTER if served_name is None else self.adapters[served_name]

    def _prefill(self, requests: list[GenerationRequest]) -> tuple[torch.Tensor, Any, torch.Tensor]:
        longest = max(len(r.prompt_ids) for r in requests)
        pad_id = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(requests), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), longest), dtype=torch.long)
        for row, request in enumerate(requests):
            length = len(request.prompt_ids)
            input_ids[row, longest - length :] = torch.tensor(request.prompt_ids)
            mask[row, longest - length :] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = engine_cache()
        adapters = [self._peft_adapter(r.adapter) for r in requests]
        logits = self._forward(input_ids, mask, position_ids, cache, adapters)
        self.metrics.prefill_tokens_total += int(mask.sum())
        return logits, cache, mask

    def _merge(
        self,
        sequences: list[RunningChoice],
        cache: Any,
        mask: torch.Tensor,
        next_tokens: torch.Tensor,
    ) -> None:
        self._rows.join(cache, mask)
        if self._batch:
            next_tokens = torch.cat([self._next_tokens, next_tokens])
        self._batch, self._next_tokens = self._batch + sequences, next_tokens

    def _decode_step(self) -> None:
        batch = self._batch
        adapters = [self._peft_adapter(s.request.adapter) for s in batch]
        step = self._rows.step(self._next_tokens, (s.length for s in batch), adapters)
        for sequence in batch:
            sequence.length += 1
        started = time.perf_counter()
        try:
            logits = self._forward(
                step.input_ids, step.attention_mask, step.position_ids, step.cache, step.adapters
            )
            logits = self._rows.batch_logits(logits)
            if self._profile and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the forward's kernels done: time it whole
        except Exception as error:
            logger.exception("decode step failed")
            for sequence in batch:
                self._finish(sequence, "error", f"decode step failed: {error}")
            return
        forwarded = time.perf_counter()
        self.metrics.decode_steps_total += 1
        self.metrics.decode_rows_total += len(batch)
        self.metrics.max_batch_size_seen = max(self.metrics.max_batch_size_seen, len(batch))
        drawn = self._draw(logits, batch)
        sampled = time.perf_counter()
        self._record_rows(batch, drawn)
        self._next_tokens = drawn[0].tokens
        self.metrics.decode_forward_seconds_total += forwarded - started
        self.metrics.decode_sampling_seconds_total += sampled - forwarded
        self.metrics.decode_rows_seconds_total += time.perf_counter() - sampled

    def _sample_rows(self, logits: torch.Tensor, sequences: list[RunningChoice]) -> torch.Tensor:
        """Sample one token per row, record it, and finish rows that hit a stop condition.

        The batch is processed and sampled on the logits' device in one pass (`_draw`); one
        copy brings the tokens and logprobs to the host for the rows' text and stop checks
        (`_record_rows`). The returned tokens stay on the device as the next step's input.
        """
        drawn = self._draw(logits, sequences)
        self._record_rows(sequences, drawn)
        return drawn[0].tokens

    def _draw(
        self, logits: torch.Tensor, sequences: list[RunningChoice]
    ) -> tuple[SampledBatch, Any]:
        """The batch's draws on the device, and their host copy (tokens, logprobs, tops)."""
        for sequence in sequences:
            if not sequence.finished and sequence.request.cancelled:
                self._finish(sequence, "cancelled", None)
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        params = [s.request.params for s in sequences]
        counts, prompts = [s.token_counts for s in sequences], [s.prompt_id_set for s in sequences]
        masked = any(s.constraint is not None for s in sequences)
        processed = processed_logits(logits, params, counts, prompts, masked=masked)
        self._apply_grammars(processed, sequences)
        sampled = sample_batch(processed, raw_logprobs, params, [s.generator for s in sequences])
        return sampled, sampled.to_host()

    def _record_rows(self, sequences: list[RunningChoice], drawn: tuple[SampledBatch, Any]) -> None:
        """Each live row's token, text and stop checks, on the host; a failing row finishes."""
        tokens, logprobs, tops = drawn[1]
        for row, sequence in enumerate(sequences):
            if sequence.finished:
                continue
            top = tops[row][: sequence.request.params.top_logprobs]
            try:
                self._record_token(sequence, tokens[row], logprobs[row], top)
            except Exception as error:
                logger.exception("sampling failed for one row")
                self._finish(sequence, "error", f"sampling failed: {error}")

    def _apply_grammars(self, logits: torch.Tensor, sequences: list[RunningChoice]) -> None:
        """Mask each live constrained row with its grammar; a row whose constraint fails
        finishes with the error."""
        constrained = {
            row: s.constraint
            for row, s in enumerate(sequences)
            if s.constraint is not None and not s.finished
        }
        for row, error in mask_rows(logits, constrained).items():
            self._finish(sequences[row], "error", f"sampling failed: {error}")

    def _record_token(
        self, sequence: RunningChoice, token: int, logprob: float, top: list[tuple[int, float]]
    ) -> None:
        if sequence.constraint is not None:
            sequence.constraint.advance(token)
        sequence.token_ids.append(token)
        sequence.logprobs.append(logprob)
        sequence.top_logprobs.append(top)
        sequence.token_counts[token] = sequence.token_counts.get(token, 0) + 1
        self.metrics.generated_tokens_total += 1
        self._after_token(sequence, token, logprob, top)

    def _after_token(
        self, sequence: RunningChoice, token: int, logprob: float, top: list[tuple[int, float]]
    ) -> None:
        params = sequence.request.params
        emit = sequence.request._emit
        assert emit is not None
        out_of_room = (
            len(sequence.token_ids) >= params.max_new_tokens
            or sequence.length + 1 >= self.context_length
        )
        last = out_of_room or token in self.eos_token_ids
        sequence.text += decode_increment(self.tokenizer, sequence, final=last)
        text = sequence.text
        stop_at = sequence.stops.feed(text)
        reason: str | None = None
        if stop_at is not None:
            text, reason = text[:stop_at], "stop"
        elif token in self.eos_token_ids:
            reason = "stop"
        elif out_of_room:
            reason = "length"
        else:  # hold back what may be the start of a stop string
            text = text[: len(text) - sequence.stops.held_back]
        delta = text[len(sequence.emitted_text) :]
        sequence.emitted_text += delta
        if sequence.request.stream_tokens:
            emit(TokenEvent(sequence.choice_index, token, logprob, top, delta))
        if reason is not None:
            self._finish(sequence, reason, None, text=text)

    def _finish(
        self, sequence: RunningChoice, reason: str, error: str | None, *, text: str | None = None
    ) -> None:
        if sequence.finished:
            return
        sequence.finished = True
        if text is None:
            text = sequence.emitted_text
        if reason == "error":
            self.metrics.requests_failed += 1
        if reason == "cancelled":
            self.metrics.requests_cancelled += 1
        emit = sequence.request._emit
        assert emit is not None
        emit(
            FinishEvent(
                choice_index=sequence.choice_index,
                finish_reason=reason,
                text=text,
                token_ids=list(sequence.token_ids),
                logprobs=list(sequence.logprobs),
                top_logprobs=list(sequence.top_logprobs),
                error=error,
            )
        )

    def _finish_request_early(self, request: GenerationRequest, reason: str, error: str | None):
        for choice_index in range(request.n):
            sequence = RunningChoice(request, choice_index, None)
            self._finish(sequence, reason, error)

    def _fail_everything(self, new_requests: list[GenerationRequest], message: str) -> None:
        for sequence in self._batch:
            self._finish(sequence, "error", message)
        for request in new_requests:
            self._finish_request_early(request, "error", message)
        self._batch, self._next_tokens = [], None
        self._rows.clear()

    def _drop_finished(self) -> None:
        if not self._batch:
            return
        keep = [row for row, sequence in enumerate(self._batch) if not sequence.finished]
        if len(keep) == len(self._batch):
            return
        self._rows.keep(keep)
        index = torch.tensor(keep, dtype=torch.long, device=self._next_tokens.device)
        self._next_tokens = self._next_tokens[index] if keep else None
        self._batch = [self._batch[row] for row in keep]


def _on_device(mask: Any, device: torch.device) -> Any:
    """A mask on `device`: a tensor, or (a static step's) tensors by cache layer type."""
    if isinstance(mask, dict):
        return {kind: tensor.to(device) for kind, tensor in mask.items()}
    return mask.to(device)
