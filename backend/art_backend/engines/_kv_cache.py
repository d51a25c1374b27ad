"""The engine's KV cache: every layer keeps every token, rows merge and drop, layers grow in place.

Which cache layer types transformers uses, and what the engine does with each:

| layer type (config.layer_types) | transformers' dynamic layer | here |
|---|---|---|
| full_attention | DynamicLayer | GrowingLayer (below) |
| sliding_attention (Gemma 3, Mistral, GPT-OSS, Cohere 2) | DynamicSlidingWindowLayer | GrowingLayer |
| chunked_attention (Llama 4) | DynamicSlidingWindowLayer | refused |
| indexed_attention, linear_attention, conv, hybrid*, dummy | their own | refused |

Sliding-window layers keep their whole history here instead of the last `window - 1` keys. Rows
are left-padded (a row's real tokens end at the last column, with no gaps), so the distance
between two columns is the distance between two tokens, and transformers' sliding-window mask,
built on the cache's columns, gives each row exactly its own window. transformers' sliding layer
counts tokens in `cumulative_length` and keeps a per-layer slice that left padding, merging and
trimming would all have to rewrite (merging two of them failed with a size mismatch: the bug that
made this table). The cost is memory: a sliding layer holds the full context, not the window
(Gemma 3 at a few thousand tokens: a few MB a row). Chunked attention's chunks start at absolute
positions, which left padding shifts, and the other types carry recurrent or shared state: a
model with any of them is refused at start (`check_servable`), naming its family and layer types.

transformers' DynamicLayer concatenates the whole cache with each new token: at batch 16 and a
few hundred tokens that copy is over a tenth of a CPU decode step. GrowingLayer keeps room for
`ROOM` more tokens and only copies when the room runs out (amortised O(1) per token). The engine
converts a prefilled cache's layers to it; `keys`/`values` stay plain tensors (views) to
everything that reads them, and assigning them (batch selection, merging, trimming) reallocates.

`append_rows` merges newly prefilled rows into the running batch, `keep_rows` drops finished
ones.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

from art_backend._errors import UnsupportedModelError

ROOM = 64  # tokens of spare room per layer; a copy happens once per ROOM tokens
SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")


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
        # transformers 5.24 dropped the layer's `dtype` (the tensors carry it); `device` stays.
        grown.device = layer.keys.device
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


def cache_keyword(model: Any) -> str:
    """The keyword the model's forward takes its KV cache under.

    transformers 5.24 renamed `past_key_values` to `cache`; the old name still works until 5.40
    but warns on every call, which is every decode step here. A forward that names neither (a
    patched one taking `**kwargs`) gets the old name, which both generations accept.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = inspect.signature(base.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def layer_types(config: Any) -> list[str]:
    """The cache layer type of each decoder layer, as transformers' DynamicCache reads them."""
    types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return list(types)


def check_servable(config: Any) -> None:
    """Refuse, naming the family, a model whose cache layers the engine cannot pad and merge."""
    kinds = layer_types(config)
    refused = sorted(set(kinds) - set(SERVED_LAYER_TYPES))
    if refused:
        family = getattr(config, "model_type", type(config).__name__)
        raise UnsupportedModelError(
            f"The torch engine cannot serve '{family}' models: their {', '.join(refused)} "
            f"layers keep a state it cannot batch (it serves {' and '.join(SERVED_LAYER_TYPES)} "
            "layers). Serve this model with --engine vllm, or pick a supported family "
            "(docs/models.md lists the tested ones)."
        )


def engine_cache() -> DynamicCache:
    """An empty cache for a prefill: plain layers that keep every token, whatever the config
    says (sliding windows come from the mask; see the table above)."""
    return DynamicCache()


def make_growing(cache: Any) -> None:
    """Convert a prefilled engine cache's layers in place."""
    cache.layers = [
        GrowingLayer.from_layer(layer) if type(layer) is DynamicLayer else layer
        for layer in cache.layers
    ]


def append_rows(
    cache: Any, mask: torch.Tensor, new_cache: Any, new_mask: torch.Tensor
) -> torch.Tensor:
    """Append `new_cache`'s rows to `cache` (in place), both left-padded to the longer; the mask."""
    target = max(mask.shape[1], new_mask.shape[1])
    for layer, new_layer in zip(cache.layers, new_cache.layers, strict=True):
        layer.keys = torch.cat([_left_pad(layer.keys, target), _left_pad(new_layer.keys, target)])
        layer.values = torch.cat(
            [_left_pad(layer.values, target), _left_pad(new_layer.values, target)]
        )
    return torch.cat([_left_pad_mask(mask, target), _left_pad_mask(new_mask, target)])


def keep_rows(
    cache: Any, mask: torch.Tensor, keep: list[int], device: torch.device
) -> torch.Tensor:
    """Keep only rows `keep` of `cache` (in place); columns now padding in every row go. The mask."""
    index = torch.tensor(keep)
    cache.batch_select_indices(index.to(device))
    mask = mask[index]
    real_columns = mask.any(dim=0).nonzero()
    first = int(real_columns[0]) if len(real_columns) else 0
    if first > 0:
        mask = mask[:, first:]
        for layer in cache.layers:
            layer.keys = layer.keys[:, :, first:, :]
            layer.values = layer.values[:, :, first:, :]
    return mask


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - tensor.shape[2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros((tensor.shape[0], tensor.shape[1], missing, tensor.shape[3]))
    return torch.cat([pad, tensor], dim=2)


def _left_pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - mask.shape[1]
    if missing == 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)
