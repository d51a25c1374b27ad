"""The static decode step's rows: which slot of the `SlotCache` each running row holds, and the
inputs of a step in the slots' shape.

The engine's batch is a list of rows (choices); a row joins at the end and rows that finish
leave from anywhere. Here each row holds a slot: a row that finishes frees its slot, a row that
joins takes the lowest free one, and neither moves any other row's keys. A step runs over every
slot of the shape (`_step_shapes.py`): its inputs are scattered from row order into slot order
and its logits gathered back (no gather while rows hold slots 0..n-1 in order, the usual case).

The cache changes shape in three places only, each one copy of the live rows:
- a join that needs more slots or columns than the shape has (grown to the joined rows' bucket);
- a step whose longest row has filled every column (grown to the next column bucket);
- a finish after which the live rows fit in a smaller shape, with room to double
  (`step_shape(2 x rows, ...)`): rows move to slots 0..n-1. The doubling is the hysteresis
  that keeps a batch which hovers around a bucket size from copying at every join and finish.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import torch

from art_backend.engines._gqa_attention import ATTENTION as GROUPED
from art_backend.engines._kv_cache import layer_types
from art_backend.engines._static_cache import SlotCache
from art_backend.engines._step_shapes import StepShape, step_shape

BOOLEAN_MASK_ATTENTION = ("sdpa", "art_batch_invariant", GROUPED)  # take True = attend
ADDITIVE_MASK_ATTENTION = ("eager",)  # take 0 = attend, the dtype's minimum = masked


@dataclass
class StepInputs:
    """A decode step's forward inputs, in the cache's row order."""

    input_ids: torch.Tensor  # [rows, 1]
    attention_mask: Any  # a 2-D mask, a 4-D one, or 4-D ones by cache layer type
    position_ids: torch.Tensor  # [rows, 1]
    cache: Any
    adapters: list[str]  # one per row


@dataclass
class StaticStepCounters:
    """What the static rows did: steps in a bucketed shape and outside (eager), reshapes, and
    the shapes it has run (a compiler's cache keys)."""

    bucketed_steps: int = 0
    eager_steps: int = 0
    reshapes: int = 0
    shapes: set[StepShape] = field(default_factory=set)


class StaticRows:
    """Running rows in a `SlotCache`: joins, finishes and step inputs (see the module doc)."""

    def __init__(self, config: Any, pad_token_id: int) -> None:
        self.kinds = sorted(set(layer_types(config)))
        self.window: int | None = getattr(config, "sliding_window", None)
        self.additive_mask = config._attn_implementation in ADDITIVE_MASK_ATTENTION
        self.pad_token_id = pad_token_id
        self.cache: SlotCache | None = None
        self.slot_of_row: list[int] = []
        self.counters = StaticStepCounters()
        self._free: list[int] = []  # a heap: the lowest free slot is taken first
        self._live = torch.zeros(0, dtype=torch.long)
        self._steps = 0
        self._start: dict[int, int] = {}  # slot -> its length minus the steps run so far
        self._slot_index = torch.zeros(0, dtype=torch.long)
        self._in_order = True  # row r holds slot r for every r

    @property
    def longest(self) -> int:
        """The most tokens any live slot holds (host-side, no device read)."""
        return max(self._start[slot] for slot in self.slot_of_row) + self._steps

    def join(self, prefilled: Any, mask: torch.Tensor) -> None:
        """Rows of a prefilled, left-padded cache (`mask`: 1 = a real token) join after the
        running ones; each takes the lowest free slot."""
        rows, width = mask.shape
        needed = max(width, self.longest if self.slot_of_row else 0) + 1
        if self.cache is None:
            self._reshape(step_shape(rows, needed), [], prefilled)
        elif len(self._free) < rows or needed > self.cache.shape.columns:
            current = self.cache.shape
            wanted = step_shape(len(self.slot_of_row) + rows, needed)
            grown = step_shape(max(wanted.slots, current.slots), max(needed, current.columns))
            self._reshape(grown, list(range(current.slots)))
        assert self.cache is not None
        slots = [heapq.heappop(self._free) for _ in range(rows)]
        self.cache.place(slots, prefilled, mask)
        for slot, length in zip(slots, mask.sum(dim=1).tolist(), strict=True):
            self._start[slot] = int(length) - self._steps
        self.slot_of_row = self.slot_of_row + slots
        self._rows_changed()

    def keep(self, keep: list[int]) -> None:
        """Keep rows `keep` (in that order); the others' slots are freed, and the cache shrinks
        when the rest fits in a smaller shape twice over."""
        assert self.cache is not None
        kept = [self.slot_of_row[row] for row in keep]
        freed = sorted(set(self.slot_of_row) - set(kept))
        self.cache.release(freed)
        for slot in freed:
            del self._start[slot]
            heapq.heappush(self._free, slot)
        self.slot_of_row = kept
        if not kept:
            self.clear()
            return
        target = step_shape(2 * len(kept), self.longest + 1)
        current = self.cache.shape
        if target.slots < current.slots or target.columns < current.columns:
            fitted = step_shape(min(target.slots, current.slots), self.longest + 1)
            self._reshape(fitted, kept)
        self._rows_changed()

    def clear(self) -> None:
        """No rows: the cache goes (a new batch allocates its own shape)."""
        self.cache, self.slot_of_row, self._free, self._start = None, [], [], {}
        self._live = torch.zeros(0, dtype=torch.long)
        self._steps = 0

    def step(self, next_tokens: torch.Tensor, lengths: Any, adapters: list[str]) -> StepInputs:
        """The next decode step's inputs: each row's token and adapter in its slot, the
        positions and masks from the slots' lengths (`lengths`, the rows' own, is not read: the
        cache keeps them as tensors). Advances the lengths."""
        assert self.cache is not None
        if self.longest + 1 > self.cache.shape.columns:
            current = self.cache.shape
            self._reshape(step_shape(current.slots, self.longest + 1), list(range(current.slots)))
            self._rows_changed()
        shape = self.cache.shape
        self.counters.shapes.add(shape)
        if shape.bucketed:
            self.counters.bucketed_steps += 1
        else:
            self.counters.eager_steps += 1
        tokens = next_tokens
        slot_adapters = adapters
        if not self._in_order or shape.slots != len(self.slot_of_row):
            tokens = torch.full(
                (shape.slots,),
                self.pad_token_id,
                dtype=next_tokens.dtype,
                device=next_tokens.device,
            )
            tokens[self._slot_index.to(tokens.device)] = next_tokens
            # An idle slot runs through the first row's adapter: one adapter for the batch keeps
            # PEFT's single-adapter forward.
            slot_adapters = [adapters[0]] * shape.slots
            for row, slot in enumerate(self.slot_of_row):
                slot_adapters[slot] = adapters[row]
        positions = self.cache.begin_step(self._live)
        self._steps += 1
        return StepInputs(
            tokens[:, None], self._model_mask(positions), positions[:, None], self.cache,
            slot_adapters,
        )  # fmt: skip

    def batch_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The step's logits [slots, V] in row order [rows, V]."""
        if self._in_order:
            return logits[: len(self.slot_of_row)]
        return logits[self._slot_index.to(logits.device)]

    def _model_mask(self, positions: torch.Tensor) -> Any:
        assert self.cache is not None
        masks = self.cache.masks(positions, self.window)
        if self.additive_mask:
            dtype = self.cache.keys[0].dtype
            masks = {
                kind: torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                    ~mask, torch.finfo(dtype).min
                )
                for kind, mask in masks.items()
            }
        if len(self.kinds) == 1:  # the model takes one mask for every layer
            return masks[self.kinds[0]]
        return {kind: masks[kind] for kind in self.kinds}

    def _reshape(self, shape: StepShape, moved: list[int], prefilled: Any = None) -> None:
        """A cache of `shape` holding the slots `moved` as its slots 0..len(moved)-1."""
        if self.cache is None:
            self.cache = SlotCache.like(prefilled, shape)
        else:
            self.cache = self.cache.resized(shape, moved)
            self.counters.reshapes += 1
        renamed = {old: new for new, old in enumerate(moved)}
        self._start = {renamed[slot]: start for slot, start in self._start.items()}
        self.slot_of_row = [renamed[slot] for slot in self.slot_of_row]
        self._free = sorted(set(range(shape.slots)) - set(self.slot_of_row))

    def _rows_changed(self) -> None:
        assert self.cache is not None
        slots = self.cache.shape.slots
        self._in_order = self.slot_of_row == list(range(len(self.slot_of_row)))
        self._slot_index = torch.tensor(self.slot_of_row, dtype=torch.long)
        live = torch.zeros(slots, dtype=torch.long)
        live[self._slot_index] = 1
        self._live = live.to(self.cache.lengths.device)
