"""The torch engine's running rows and their KV cache, left-padded or in slots (`ART_DECODE_STEP`).

| ART_DECODE_STEP | rows | a join | a finish | a step's mask |
|---|---|---|---|---|
| `dynamic` (default) | left-padded to a common length (`_kv_cache.py`) | re-pads and copies the cache | copies the cache | one more 2-D column; transformers builds the 4-D mask |
| `static` | one slot each in a preallocated cache (`_static_rows.py`) | copies the joining rows only | frees a slot, no copy | from the slots' lengths |
| `compiled` | as `static`; its steps through `torch.compile` (`_compiled_step.py`) | as `static` | as `static` | as `static` |

Both take the same calls from the engine: `join` after a prefill, `keep` after rows finish,
`step` for a decode step's inputs and `batch_logits` for its logits in row order. `dynamic` stays
the default until the static step measures faster (docs/performance.md). Any other value is
refused at start, naming the variable; so is a model whose attention takes neither a boolean
nor an additive mask under `static` or `compiled`.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import torch

from art_backend._errors import ModelLoadError
from art_backend.engines._kv_cache import append_rows, keep_rows, make_growing
from art_backend.engines._static_rows import (
    ADDITIVE_MASK_ATTENTION,
    BOOLEAN_MASK_ATTENTION,
    StaticRows,
    StepInputs,
)

VARIABLE = "ART_DECODE_STEP"
LAYOUTS = ("dynamic", "static", "compiled")


class DecodeRows(Protocol):
    """Where the running rows' keys and values live between decode steps."""

    def join(self, prefilled: Any, mask: torch.Tensor) -> None:
        """Append a prefilled cache's rows (`mask` [rows, columns], left-padded) to the batch."""

    def keep(self, keep: list[int]) -> None:
        """Keep only rows `keep`, in that order (none: the batch is empty)."""

    def clear(self) -> None:
        """Forget every row."""

    def step(self, next_tokens: torch.Tensor, lengths: Any, adapters: list[str]) -> StepInputs:
        """A decode step's forward inputs for `next_tokens` (one per row, in row order)."""

    def batch_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The step's last-position logits in row order."""


class DynamicRows:
    """Left-padded rows in a growing DynamicCache (`_kv_cache.py`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [rows, columns] 1 for real tokens, 0 for padding

    def join(self, prefilled: Any, mask: torch.Tensor) -> None:
        """Merge by left-padding the shorter of the two caches (a copy of both)."""
        make_growing(prefilled)  # from here on, a new token is written in place
        if self.cache is None or self.mask is None:
            self.cache, self.mask = prefilled, mask
        else:
            self.mask = append_rows(self.cache, self.mask, prefilled, mask)

    def keep(self, keep: list[int]) -> None:
        """Select the kept rows, trimming columns that became padding in all of them."""
        if not keep:
            self.clear()
            return
        assert self.mask is not None
        self.mask = keep_rows(self.cache, self.mask, keep, self.device)

    def clear(self) -> None:
        """Drop the cache and the mask."""
        self.cache, self.mask = None, None

    def step(self, next_tokens: torch.Tensor, lengths: Any, adapters: list[str]) -> StepInputs:
        """One more mask column; positions from the rows' lengths (an iterable of ints)."""
        assert self.mask is not None
        self.mask = torch.cat([self.mask, torch.ones((len(adapters), 1), dtype=torch.long)], dim=1)
        positions = torch.tensor([[length] for length in lengths])
        return StepInputs(next_tokens.unsqueeze(1), self.mask, positions, self.cache, adapters)

    def batch_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Rows are the cache's rows: as they are."""
        return logits


def decode_step_layout() -> str:
    """`ART_DECODE_STEP`, checked: dynamic (the default), static or compiled; else a
    `ModelLoadError`."""
    value = os.environ.get(VARIABLE, "dynamic").strip().lower() or "dynamic"
    if value not in LAYOUTS:
        raise ModelLoadError(
            f"{VARIABLE}={os.environ[VARIABLE]!r} is not a decode step layout: use dynamic "
            "(the default: left-padded rows), static (preallocated slots) or compiled (the "
            "static step through torch.compile), or unset it"
        )
    return value


def decode_rows(model: Any, pad_token_id: int, device: torch.device) -> DecodeRows:
    """The rows layout `ART_DECODE_STEP` names, for `model` (refused by name where static cannot
    pass the model its mask)."""
    if decode_step_layout() == "dynamic":
        return DynamicRows(device)
    config = model.config
    attention = config._attn_implementation
    if attention not in BOOLEAN_MASK_ATTENTION + ADDITIVE_MASK_ATTENTION:
        family = getattr(config, "model_type", type(config).__name__)
        raise ModelLoadError(
            f"{VARIABLE}={decode_step_layout()} cannot run this '{family}' model: its attention "
            f"({attention!r}) takes a mask the static step does not build (it builds "
            f"{', '.join(BOOLEAN_MASK_ATTENTION + ADDITIVE_MASK_ATTENTION)} masks). "
            f"Unset {VARIABLE} to decode with the dynamic step."
        )
    return StaticRows(config, pad_token_id)
