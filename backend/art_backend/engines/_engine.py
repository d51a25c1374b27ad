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
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from art_backend._errors import InvalidRequestError
from art_core.wire import SEED_RANGE

# The bounds every route's sampling settings meet, whatever protocol brought them (OpenAI's,
# Anthropic's, the Tinker API's). Temperature: OpenAI's 0..2 (vLLM sets no upper bound; past 2
# a small model's distribution is close to uniform noise, and the Tinker cookbook samples at
# 1.0 or below). Stop strings in all: matching costs nothing per token however many there are
# (`_text.StopMatcher`), but its automaton is built from every character of them, on the
# engine's thread (20,000 strings of 100 characters held every chat 9.75 s).
TEMPERATURE_RANGE = (0.0, 2.0)
MAX_STOP_CHARACTERS = 16_384
PENALTY_RANGE = (-2.0, 2.0)  # presence and frequency penalties: OpenAI's and vLLM's
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's


@dataclass
class SamplingParams:
    """Per-choice sampling settings; they check themselves where they are built (vLLM's
    `SamplingParams._verify_args`), so no route can forget a bound: a value outside the bounds
    above is an `InvalidRequestError` naming the field. The routes' schemas check first, with
    their own messages; this is the net under all of them."""

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

    def __post_init__(self) -> None:
        _within("temperature", self.temperature, *TEMPERATURE_RANGE)
        _within("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _within("min_p", self.min_p, 0.0, 1.0)
        _within("presence_penalty", self.presence_penalty, *PENALTY_RANGE)
        _within("frequency_penalty", self.frequency_penalty, *PENALTY_RANGE)
        _within("repetition_penalty", self.repetition_penalty, 0.0, math.inf, low_open=True)
        _at_least("max_new_tokens", self.max_new_tokens, 1)
        _at_least("top_k", self.top_k, 0)
        _at_least("top_logprobs", self.top_logprobs, 0)
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise InvalidRequestError(
                f"seed {self.seed} is outside [-2**63, 2**63 - 1]; give a 64-bit seed.",
                param="seed",
            )
        characters = sum(len(stop) for stop in self.stop)
        if characters > MAX_STOP_CHARACTERS:
            raise InvalidRequestError(
                f"The stop strings hold {characters:,} characters in all; at most "
                f"{MAX_STOP_CHARACTERS:,} are served. Stop on a shorter marker.",
                param="stop",
            )
        for token, bias in self.logit_bias.items():
            _within(f"logit_bias[{token}]", bias, *LOGIT_BIAS_RANGE, param="logit_bias")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _within(
    name: str,
    value: float,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    param: str | None = None,
) -> None:
    """A finite `value` in [low, high] (or (low, high] when `low_open`), else a 400 naming it."""
    above_low = value > low if low_open else value >= low
    if not (math.isfinite(value) and above_low and value <= high):
        opening = "(" if low_open else "["
        closing = ")" if math.isinf(high) else "]"
        raise InvalidRequestError(
            f"{name} is {value}; it must be a finite number in {opening}{low:g}, {high:g}"
            f"{closing}.",
            param=param or name,
        )


def _at_least(name: str, value: int, low: int) -> None:
    """An integer `value` of at least `low`, else a 400 naming it."""
    if value < low:
        raise InvalidRequestError(f"{name} is {value}; it must be at least {low}.", param=name)


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
    # ART_DECODE_STEP=compiled: steps through the compiled graph, and the seconds spent
    # compiling (each compiled shape's first step).
    decode_compiled_steps_total: int = 0
    decode_compile_seconds_total: float = 0.0


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
