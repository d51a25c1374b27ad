"""The static decode step compiled (`ART_DECODE_STEP=compiled`): the slot cache's step through
`torch.compile`, one compiled graph per bucketed shape, eager for everything else.

| a decode step | runs |
|---|---|
| a bucketed shape (`_step_shapes.py`), one adapter (or none) for every row | compiled |
| a shape past the buckets, a batch mixing adapters, a shape past `MAX_SHAPES` | eager, counted |

- **Backend.** Inductor on a CPU; on a GPU `mode="reduce-overhead"`, which captures the step
  as a CUDA graph (the GPU issue: not run on a GPU yet, docs/gpu.md).
- **Compile time.** A shape's first step traces and compiles (SmolLM2-135M on 2 CPU threads:
  ~25 s from an empty inductor cache, ~10 s when its on-disk cache has it from an earlier
  start). At most `MAX_SHAPES` shapes are compiled; later ones run eager, so a server's compile
  time is bounded. The seconds are counted (`art_decode_compile_seconds_total` on /metrics).
- **Invalidation.** Weights are the graph's inputs, not constants: a LoRA whose weights are
  loaded into a retired adapter's layers, or a base weight changed in place, runs with its new
  values; a new adapter (new layers) or an adapter switched on or off fails the graph's guards
  and recompiles. oneDNN's packed weights and the float32 LM head are refreshed before each
  compiled step (`refresh_packs`, `refresh_head`), since a storage pointer cannot be read while
  tracing; q/k/v and gate/up run there as packed layers of their own (`_sibling_linear`).
- **Not with the batch-invariant attention.** Inductor computes a chain of fused bf16
  operations without eager's rounding between them and sums the norms in another order, so a
  compiled step's bf16 logprobs are close to the trainer's, not equal: `compiled` with
  `ART_BATCH_INVARIANT` on is refused at start (`check_compilable`). (A probe with inductor's
  `emulate_precision_casts`, the norms kept out of its kernels and the float64 attention over
  the filled columns only was equal bit for bit, but no faster than the eager step, 0.93-1.0x:
  docs/performance.md.)

Measured on a 2-core Xeon (docs/performance.md, "The compiled decode step"): 1.09x the eager
step in bf16 without the batch-invariant attention, even in float32; so `dynamic` stays the
default.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from art_backend._errors import ModelLoadError
from art_backend.engines._batch_invariant import is_batch_invariant
from art_backend.engines._decode_rows import decode_step_layout
from art_backend.engines._engine import EngineMetrics
from art_backend.engines._float32_logits import refresh_head
from art_backend.engines._gqa_attention import use_grouped_attention
from art_backend.engines._packed_linear import refresh_packs
from art_backend.engines._static_cache import SlotCache
from art_backend.engines._step_shapes import StepShape

logger = logging.getLogger("art_backend.engine")

MAX_SHAPES = 8  # compiled (shape, adapter state) pairs at most; dynamo's own recompile limit
_RECOMPILE_LIMIT = 2 * MAX_SHAPES  # raised to this for the step's frames (the default is 8)


@dataclass
class CompileCounters:
    """Steps compiled and eager, the compiles' seconds, and the shapes compiled."""

    compiled_steps: int = 0
    eager_steps: int = 0
    compile_seconds: float = 0.0
    shapes: set[tuple[StepShape, str]] = field(default_factory=set)


def compiled_step(
    model: Any, cache_keyword: str, device: torch.device, metrics: EngineMetrics
) -> CompiledStep | None:
    """The compiled step where `ART_DECODE_STEP=compiled` (checked: `check_compilable`), else
    None; it counts its steps and compile seconds into `metrics` too."""
    if decode_step_layout() != "compiled":
        return None
    check_compilable(model)
    use_grouped_attention(model)
    return CompiledStep(cache_keyword, device, metrics)


class CompiledStep:
    """The engine's compiled decode forward (see the module doc)."""

    def __init__(self, cache_keyword: str, device: torch.device, metrics: EngineMetrics) -> None:
        self.metrics = metrics
        self.cache_keyword = cache_keyword
        self.counters = CompileCounters()
        mode = "reduce-overhead" if device.type == "cuda" else None
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, _RECOMPILE_LIMIT)
        self._function = torch.compile(_decode_logits, dynamic=False, mode=mode)
        self._full_logged = False

    def runs(self, cache: Any, adapter_state: str | None) -> bool:
        """Whether a step over `cache` with the batch's one `adapter_state` (None: a mixed
        batch) runs compiled; counts the eager ones."""
        if not isinstance(cache, SlotCache):
            return False  # a prefill
        compiled = (
            cache.shape.bucketed
            and adapter_state is not None
            and self._admits((cache.shape, adapter_state))
        )
        if not compiled:
            self.counters.eager_steps += 1
        return compiled

    def __call__(self, model: Any, adapter_state: str, **inputs: Any) -> torch.Tensor:
        """`model`'s (the engine's: a PeftModel once an adapter is loaded) last-position logits
        of the step in float32, through the compiled graph."""
        key = (inputs["cache"].shape, adapter_state)
        refresh_packs(model)
        refresh_head(model)
        started = time.perf_counter()
        limit = sys.getrecursionlimit()
        try:
            logits = self._function(model, self.cache_keyword, **inputs)
        finally:
            # Inductor raises the process's recursion limit to 2,000 when it compiles; the
            # server's JSON parse relies on Python's (`_limits.parse_json_object`): put it back.
            sys.setrecursionlimit(limit)
        self.counters.compiled_steps += 1
        self.metrics.decode_compiled_steps_total += 1
        if key not in self.counters.shapes:
            seconds = time.perf_counter() - started
            self.counters.shapes.add(key)
            self.counters.compile_seconds += seconds
            self.metrics.decode_compile_seconds_total += seconds
            logger.info(
                "compiled the decode step for %d rows x %d columns (%s) in %.1f s",
                key[0].slots, key[0].columns, key[1], seconds,
            )  # fmt: skip
        return logits

    def _admits(self, key: tuple[StepShape, str]) -> bool:
        if key in self.counters.shapes or len(self.counters.shapes) < MAX_SHAPES:
            return True
        if not self._full_logged:
            self._full_logged = True
            logger.warning(
                "%d decode step shapes compiled (the most it compiles): new shapes run eager",
                MAX_SHAPES,
            )
        return False


def _decode_logits(
    model: Any,
    cache_keyword: str,
    *,
    input_ids: torch.Tensor,
    attention_mask: Any,
    position_ids: torch.Tensor,
    cache: Any,
) -> torch.Tensor:
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
        **{cache_keyword: cache},
    )
    return output.logits[:, -1, :].float()


def check_compilable(model: Any) -> None:
    """Refuse `ART_DECODE_STEP=compiled` where the sampler's logprobs must be the trainer's bit
    for bit (the batch-invariant attention on): a compiled step rounds otherwise."""
    if is_batch_invariant(model):
        raise ModelLoadError(
            "ART_DECODE_STEP=compiled fuses the decode step's operations, so its bf16 logprobs "
            "would no longer equal the trainer's bit for bit, which ART_BATCH_INVARIANT (on "
            "for this model) guarantees. Set ART_BATCH_INVARIANT=0 to serve compiled with "
            "logprobs close to the trainer's, or unset ART_DECODE_STEP."
        )
