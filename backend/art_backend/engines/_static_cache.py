"""A preallocated KV cache of fixed slots: a row takes a slot, a finished row frees it, no copy.

Each attention layer keeps keys and values in one buffer `[slots, kv_heads, columns, head_dim]`
(`_step_shapes.py` picks slots and columns). A slot's tokens start at column 0 and its length
is a tensor (`lengths[slot]`): a decode step writes each slot's new key and value at column
`lengths[slot]` (one indexed write per layer) and attends over the whole buffer with a mask built
from the lengths, not from a growing 2-D mask:

    full attention:     column <= position
    sliding window:     position - window < column <= position     (transformers' window)

where `position` is the slot's length before the step (its new token's position id). Columns a
slot has not written are masked, so they may hold anything finite (a freed slot's old tokens,
the prefill's padding): buffers start at zero and are only ever written with model outputs.
Idle slots (no row) feed a pad token at position 0 each step: wasted work, never NaN.

Fixed slots, not paged blocks: a slot holds a whole row's context, so a step's attention reads
each row's keys as one contiguous range, which SDPA's CPU kernel and float64_attention take as
they are. Pages would save memory for rows of very different lengths, at the price of a gather
(or a paged kernel) on every step; slots waste at most the columns' bucket rounding per row.

The cache is a transformers `Cache`: the model's attention layers call `update` and nothing
else (the mask comes with the step, so transformers never asks the cache for sizes).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache

from art_backend.engines._step_shapes import StepShape


class SlotCache(Cache):
    """Per-layer `[slots, kv_heads, columns, head_dim]` buffers and per-slot lengths."""

    def __init__(
        self, layer_shapes: list[tuple[int, int]], shape: StepShape, dtype: torch.dtype, device: Any
    ) -> None:
        super().__init__(layers=[])
        self.shape = shape
        self.layer_shapes = layer_shapes  # (kv_heads, head_dim) of each layer
        self.keys = [self._buffer(heads, dim, dtype, device) for heads, dim in layer_shapes]
        self.values = [self._buffer(heads, dim, dtype, device) for heads, dim in layer_shapes]
        self.lengths = torch.zeros(shape.slots, dtype=torch.long, device=device)
        self._slots = torch.arange(shape.slots, device=device)
        self._write_at = (self._slots, self.lengths.clone())  # (slots, columns) of the next write

    def _buffer(self, heads: int, dim: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
        return torch.zeros(
            (self.shape.slots, heads, self.shape.columns, dim), dtype=dtype, device=device
        )

    @classmethod
    def like(cls, prefilled: Any, shape: StepShape) -> SlotCache:
        """An empty slot cache with the layers, dtype and device of a prefilled DynamicCache."""
        first = prefilled.layers[0].keys
        shapes = [(layer.keys.shape[1], layer.keys.shape[3]) for layer in prefilled.layers]
        return cls(shapes, shape, first.dtype, first.device)

    # ------------------------------------------------------------------------- the model's side

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Write each slot's new key and value at its write column; the layer's whole buffers.
        An indexed assignment, not a `scatter_`: a compiled step (`_compiled_step.py`) writes it
        in place, where a scatter made it copy every buffer a step."""
        slots, columns = self._write_at
        self.keys[layer_idx][slots, :, columns] = key_states[:, :, 0, :]
        self.values[layer_idx][slots, :, columns] = value_states[:, :, 0, :]
        return self.keys[layer_idx], self.values[layer_idx]

    def begin_step(self, live: torch.Tensor) -> torch.Tensor:
        """Fix this step's write columns (the lengths now), then advance the `live` slots' lengths
        (a [slots] 0/1 tensor); returns the write columns, the new tokens' positions."""
        positions = self.lengths.clone()
        self._write_at = (self._slots, positions)
        self.lengths += live
        return positions

    # ------------------------------------------------------------------------ the engine's side

    def place(self, slots: list[int], prefilled: Any, mask: torch.Tensor) -> None:
        """Copy left-padded prefilled rows (`mask` [rows, prompt columns], 1 = a real token) into
        `slots`, each starting at column 0; their lengths become their prompts' lengths."""
        rows, width = mask.shape
        device = self.lengths.device
        prompt_lengths = mask.sum(dim=1).to(device)
        # Row r's real tokens are its last L_r columns: rotate each row left by its padding
        # (the padding lands after the prompt, where the mask hides it).
        padding = width - prompt_lengths
        columns = (torch.arange(width, device=device)[None, :] + padding[:, None]) % width
        index = torch.tensor(slots, device=device)
        for layer, prefilled_layer in enumerate(prefilled.layers):
            heads, dim = self.layer_shapes[layer]
            gather = columns[:, None, :, None].expand(rows, heads, width, dim)
            self.keys[layer][index, :, :width] = prefilled_layer.keys.gather(2, gather)
            self.values[layer][index, :, :width] = prefilled_layer.values.gather(2, gather)
        self.lengths[index] = prompt_lengths

    def release(self, slots: list[int]) -> None:
        """Free `slots`: their lengths go back to 0 (their columns are masked from then on)."""
        if slots:
            self.lengths[torch.tensor(slots, device=self.lengths.device)] = 0

    def resized(self, shape: StepShape, moved: list[int]) -> SlotCache:
        """A cache of `shape` whose slot i holds this cache's slot `moved[i]` (its first
        `shape.columns` columns: the caller keeps every live row within them)."""
        first = self.keys[0]
        other = SlotCache(self.layer_shapes, shape, first.dtype, first.device)
        index = torch.tensor(moved, device=first.device)
        width = min(shape.columns, self.shape.columns)
        for mine, theirs in ((self.keys, other.keys), (self.values, other.values)):
            for layer, buffer in enumerate(mine):
                theirs[layer][: len(moved), :, :width] = buffer[index, :, :width]
        other.lengths[: len(moved)] = self.lengths[index]
        return other

    def masks(self, positions: torch.Tensor, window: int | None) -> dict[str, torch.Tensor]:
        """Boolean masks [slots, 1, 1, columns] (True = attend) by cache layer type, for tokens
        at `positions` (one per slot)."""
        columns = torch.arange(self.shape.columns, device=positions.device)[None, :]
        upto = positions[:, None]
        full = columns <= upto
        masks = {"full_attention": full[:, None, None, :]}
        if window is not None:
            sliding = full & (columns > upto - window)
            masks["sliding_attention"] = sliding[:, None, None, :]
        return masks
