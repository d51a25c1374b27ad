"""A KV cache layer with spare room, so appending a token writes in place.

transformers' DynamicLayer concatenates the whole cache with each new token: at batch 16 and a
few hundred tokens that copy is over a tenth of a CPU decode step. This layer keeps room for
`ROOM` more tokens and only copies when the room runs out (amortised O(1) per token). The engine
converts a prefilled cache's layers to it; `keys`/`values` stay plain tensors (views) to
everything that reads them, and assigning them (batch selection, merging, trimming) reallocates.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

ROOM = 64  # tokens of spare room per layer; a copy happens once per ROOM tokens


def _with_room(tensor: torch.Tensor, room: int) -> torch.Tensor:
    batch, heads, length, head_dim = tensor.shape
    buffer = tensor.new_empty((batch, heads, length + room, head_dim))
    buffer[:, :, :length] = tensor
    return buffer


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose buffers grow by `ROOM` tokens at a time."""

    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None
    # Keys and values are assigned one after the other (batch selection, merging), so each
    # keeps its own length: reading one while the other is being replaced stays correct.
    _key_length: int = 0
    _value_length: int = 0

    @classmethod
    def from_layer(cls, layer: Any) -> GrowingLayer:
        grown = cls()
        grown.dtype, grown.device = layer.keys.dtype, layer.keys.device
        grown.is_initialized = True
        grown.keys, grown.values = layer.keys, layer.values
        return grown

    @property  # type: ignore[override]
    def keys(self) -> torch.Tensor | None:
        return None if self._key_buffer is None else self._key_buffer[:, :, : self._key_length]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._key_buffer = None if value is None else _with_room(value, ROOM)
        self._key_length = 0 if value is None else value.shape[2]

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor | None:
        return (
            None if self._value_buffer is None else self._value_buffer[:, :, : self._value_length]
        )

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._value_buffer = None if value is None else _with_room(value, ROOM)
        self._value_length = 0 if value is None else value.shape[2]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._key_buffer is not None and self._value_buffer is not None
        start, added = self._key_length, key_states.shape[2]
        assert self._value_length == start, "keys and values out of step"
        if start + added > self._key_buffer.shape[2]:
            keys, values = self.keys, self.values
            assert keys is not None and values is not None
            self._key_buffer = _with_room(keys, added + ROOM)
            self._value_buffer = _with_room(values, added + ROOM)
        self._key_buffer[:, :, start : start + added] = key_states
        self._value_buffer[:, :, start : start + added] = value_states
        self._key_length = self._value_length = start + added
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        return keys, values


def make_growing(cache: Any) -> None:
    """Convert a prefilled DynamicCache's full-attention layers in place."""
    cache.layers = [
        GrowingLayer.from_layer(layer) if type(layer) is DynamicLayer else layer
        for layer in cache.layers
    ]
