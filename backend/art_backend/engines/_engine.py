"""The engine seam: what serving, records, training and the adapter routes need from an engine.

An engine completes prompts given as token ids. A `GenerationRequest` carries the prompt ids,
`n`, one set of `SamplingParams`, an optional adapter (served name, e.g. `agent@3`) and an
optional constraint (a grammar); `submit` returns an asyncio queue on which `TokenEvent`s (one per
sampled token, with its logprob) and one `FinishEvent` per choice arrive. Adapters are loaded and
unloaded by served name from a PEFT folder. This mirrors vLLM's own model (a request of prompt
token ids + `SamplingParams` + `LoRARequest(name, id, path)` + structured outputs, streamed back
as token ids with logprobs), so a vLLM engine implements the same protocol.

Two protocols:
  Engine           serving: submit / load_adapter / unload_adapter / metrics / start / stop
  TrainableEngine  an Engine whose model the trainer may borrow between decode steps
                   (colocated LoRA training on the served weights: today's torch engine).
An engine in another process (vLLM) is an `Engine` only; training then owns its own copy.
N engines of one model stand behind the seam as one `Engine` too (`_replicas.ReplicaSet`),
routing a request by its `session` (the rollout id).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    """Per-choice sampling settings, already validated by the HTTP layer."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    min_p: float = 0.0  # drop tokens below min_p x the best token's probability; 0 means off
    # vLLM's and HF's: seen tokens' logits (prompt and output) divided by it when positive,
    # multiplied when negative; 1 means off.
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int = 0
    grammar: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class TokenEvent:
    """One sampled token of one choice, with the text it added (may be empty while held back)."""

    choice_index: int
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    text_delta: str


@dataclass
class FinishEvent:
    """A choice is done: its full text, sampled ids, logprobs and why it stopped."""

    choice_index: int
    finish_reason: str  # "stop" | "length" | "error" | "cancelled"
    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    error: str | None = None
    unavailable: bool = False  # the engine serving it went away (a replica taken out): HTTP 503


@dataclass
class GenerationRequest:
    """A prompt to complete `n` times with one adapter and one set of sampling parameters."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    adapter: str | None = None
    constraint_factory: Callable[[], Any] | None = None  # builds one grammar matcher per choice
    stream_tokens: bool = True  # False: only FinishEvents (saves a thread hop per token)
    session: str | None = None  # the rollout id: engine replicas keep a rollout on one replica
    cancelled: bool = False
    _emit: Callable[[TokenEvent | FinishEvent], object] | None = None

    def cancel(self) -> None:
        """Ask the engine to drop this request's rows at the next step."""
        self.cancelled = True


@dataclass
class EngineMetrics:
    """Counters read by GET /metrics."""

    requests_total: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    decode_steps_total: int = 0
    decode_rows_total: int = 0  # sum of batch sizes over decode steps
    max_batch_size_seen: int = 0
    prefill_batches_total: int = 0
    prefill_tokens_total: int = 0  # prompt tokens actually run through the model
    prefill_shared_requests_total: int = 0  # requests whose prompt another one prefilled for them
    busy_seconds_total: float = 0.0
    # A decode step's three parts (torch engine): the model's forward; sampling on the device
    # with its one host copy; the rows' tokens, text and stop checks on the host. On a GPU
    # kernels run asynchronously, so the split is exact only with ART_ENGINE_PROFILE=1 (the
    # engine then waits for the forward before timing sampling).
    decode_forward_seconds_total: float = 0.0
    decode_sampling_seconds_total: float = 0.0
    decode_rows_seconds_total: float = 0.0


@runtime_checkable
class Engine(Protocol):
    """A serving engine: completes `GenerationRequest`s and serves LoRA adapters by name."""

    name: str  # "torch" or "vllm": shown at start-up, in /health and in /metrics
    tokenizer: Any  # a transformers tokenizer: chat template, decode, vocabulary
    context_length: int
    metrics: EngineMetrics
    adapters: dict[str, Any]  # served name -> the engine's own handle for it

    @property
    def queue_depth(self) -> int:
        """Requests waiting to be admitted."""
        ...

    @property
    def running_rows(self) -> int:
        """Choices being generated now."""
        ...

    @property
    def vocab_size(self) -> int:
        """Size of the model's output vocabulary (logit_bias ids are checked against it)."""
        ...

    def start(self) -> None:
        """Start serving."""
        ...

    def stop(self, timeout: float = 30.0) -> None:
        """Finish in-flight work, fail what is queued, release the model."""
        ...

    def submit(self, request: GenerationRequest) -> asyncio.Queue:
        """Queue a request; its events arrive on the returned queue (the caller's loop)."""
        ...

    def failure(self) -> str | None:
        """Why the engine can no longer serve (its process or thread died), else None."""
        ...

    def load_adapter(self, served_name: str, path: Path) -> None:
        """Serve the PEFT LoRA adapter in `path` as `served_name` (replacing one of that name)."""
        ...

    def unload_adapter(self, served_name: str) -> None:
        """Stop serving `served_name` and free it."""
        ...


@runtime_checkable
class TrainableEngine(Engine, Protocol):
    """An engine whose model a colocated trainer borrows between two decode steps."""

    device: Any  # torch.device of the model
    adaptable_modules: list[str]  # module names a LoRA may target (checked at registration)

    def add_trainable_adapter(self, adapter_name: str, peft_config: Any) -> None:
        """Add a fresh LoRA adapter that a trainer updates; never served under its own name."""
        ...

    def remove_trainable_adapter(self, adapter_name: str) -> None:
        """Remove a trainer's adapter again, leaving the model as it was before it was added."""
        ...

    def exclusive(self) -> contextlib.AbstractContextManager[Any]:
        """Hold the model between two decode steps; yields it (a PEFT model)."""
        ...
