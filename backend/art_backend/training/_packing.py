"""Shared-prefix packing: the rows of a group carry their common prompt once through the model.

A GRPO group is several samples of one prompt, so padded rows run that prompt through the model
once per sample: with SmolLM2 and 4 samples of a 166-token prompt, 3 of every 4 prompt tokens the
trainer processes are repeats. A packed row holds the group's shared prefix once and then each
row's remainder. A 4-D attention mask lets every remainder see the prefix and itself (causally),
never a sibling, and position ids restart after the prefix for each remainder, so every token
sees exactly the context and positions it has in its own row: logprobs and gradients equal the
padded forward's up to float rounding (the tests compare both). ART packs its training
sequences the same way (its packed tensors carry group and parent ids).

A GRPO group's prefix is shared only up to the first trained token of any of its rows, so a
trained token is never merged with another row's (each trains its own, with its own advantage).
A Tinker request's datums (`prefix_groups`, `share_trained`) share their whole common prefix: a
datum scores every position, and each row gathers its own label's logprob from the shared
logits (`_logprobs.packed_logprobs_and_entropy`), so two rows' losses through one shared logit
give the sum of their gradients through two equal ones. Rows in a micro-batch still
align with `Rows` (see `_rows`); only the forward differs: `PackedBatch.source` says which kept
logit predicts each trained token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from art_backend.engines._batch_invariant import ATTENTION as BATCH_INVARIANT
from art_backend.engines._gqa_attention import ATTENTION as GROUPED
from art_backend.training._rows import Rows


@dataclass(frozen=True)
class Segmented:
    """A packed forward's layout, [P, S] each: segment 0 is a packed row's prefix, j >= 1 its
    j-th remainder, -1 padding."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor

    @property
    def processed_tokens(self) -> int:
        """Tokens the packed forward runs through the model (padding excluded)."""
        return int((self.segments >= 0).sum())

    def attention_mask(
        self, dtype: torch.dtype, device: torch.device | str = "cpu", *, window: int | None = None
    ) -> torch.Tensor:
        """The additive [P, 1, S, S] mask: 0 where a query may attend, the dtype's min elsewhere.

        A query sees earlier keys of the prefix and of its own segment; with a sliding `window`,
        only those fewer than `window` positions back (its own row's positions, so the window is
        the one it has unpacked). A padding query sees itself only, so no softmax row is empty
        (its output is never used).
        """
        segments = self.segments.to(device)
        width = segments.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        query = segments[:, :, None]
        key = segments[:, None, :]
        allowed = causal & (key >= 0) & ((key == 0) | (key == query))
        if window is not None:
            positions = self.position_ids.to(device)
            allowed &= positions[:, :, None] - positions[:, None, :] < window
        allowed |= torch.eye(width, dtype=torch.bool, device=device)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[:, None]


@dataclass(frozen=True)
class PackedBatch(Segmented):
    """One micro-batch's rows and, when any of them share a prefix, the packed forward's inputs
    (`Segmented`). The model keeps the logits of packed columns `first_kept`.. (W of them);
    `source[r, c]` is the flat index p * W + (s - first_kept) of the logit that predicts
    `rows.input_ids[r, c]`, for every trained (r, c) (0 elsewhere).
    """

    rows: Rows
    first_kept: int
    source: torch.Tensor


def packed_attention_masks(
    packed: Segmented, config: Any, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The packed forward's `attention_mask` for a model of `config`.

    A model whose config lists `layer_types` takes one mask per type (transformers' forwards
    use a dict as given): its sliding layers get the windowed mask. A model with one
    `sliding_window` for every layer (Mistral) takes the windowed mask alone.
    """
    window = _sliding_window(config)
    layer_types = getattr(config, "layer_types", None)
    if window is None:
        return packed.attention_mask(dtype, device)
    if layer_types:
        masks = {"full_attention": packed.attention_mask(dtype, device)}
        masks["sliding_attention"] = packed.attention_mask(dtype, device, window=window)
        return masks
    return packed.attention_mask(dtype, device, window=window)


def _sliding_window(config: Any) -> int | None:
    """The window of the model's sliding layers, None when it has none."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return window if window and getattr(config, "use_sliding_window", True) is not False else None


def packing_supported(model: Any) -> bool:
    """Whether `model`'s forward takes the 4-D shared-prefix mask and restarted positions as given.

    transformers' own forward with SDPA or eager attention passes a 4-D mask through unchanged,
    and rotary embeddings read `position_ids`. Refused: flash-attention kernels (they take no
    mask), ALiBi models (their biases come from key indices or the 2-D mask, not positions),
    models without rotary embeddings, layer types other than full and sliding attention (chunked
    attention's chunks, linear attention's state), and a forward replaced by another library
    (Unsloth patches the model, decoder and attention classes). Sliding-window layers take a
    windowed mask (`packed_attention_masks`).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    patched = (
        [type(base), type(base.get_decoder())] if hasattr(base, "get_decoder") else [type(base)]
    )
    attention = next((m for m in base.modules() if type(m).__name__.endswith("Attention")), None)
    if attention is not None:
        patched.append(type(attention))
    if not all(cls.forward.__module__.startswith("transformers.") for cls in patched):
        return False
    if getattr(config, "_attn_implementation", None) not in (
        "sdpa",
        "eager",
        BATCH_INVARIANT,
        GROUPED,
    ):
        return False
    rotary = any(
        getattr(config, name, None) is not None for name in ("rope_parameters", "rope_theta")
    )
    if not rotary or getattr(config, "alibi", False):
        return False
    if getattr(config, "attention_chunk_size", None):
        return False
    layer_types = getattr(config, "layer_types", None) or []
    return all(kind in ("full_attention", "sliding_attention") for kind in layer_types)


def first_trained_columns(rows: Rows) -> list[int]:
    """The column of each row's first trained token (every kept row has one)."""
    trained = rows.trained_mask
    return [int(trained[r].nonzero()[0]) if trained[r].any() else 1 for r in range(rows.num_rows)]


def shared_prefix_units(
    rows: Rows, *, token_budget: int, share_trained: bool = False
) -> list[tuple[int, list[int]]]:
    """Split rows into packing units: (shared prefix length, row indices), each within budget.

    Rows of one group share the longest prefix common to all of them, cut at the first trained
    token of any unless `share_trained`; a unit's packed length (prefix + every remainder) stays
    within `token_budget` unless one row alone exceeds it. A unit of one row is that row as it is.
    """
    lengths = rows.lengths.tolist()
    first_trained = (
        [int(rows.input_ids.shape[1])] * rows.num_rows
        if share_trained
        else first_trained_columns(rows)
    )
    groups: dict[int, list[int]] = {}
    for index, group in enumerate(rows.group_ids.tolist()):
        groups.setdefault(group, []).append(index)
    units: list[tuple[int, list[int]]] = []
    for members in groups.values():
        shared = _common_prefix(rows, members, lengths)
        shared = min([shared, *(first_trained[i] for i in members)])
        if len(members) < 2 or shared < 1:
            units += [(0, [index]) for index in members]
            continue
        unit: list[int] = []
        size = shared
        for index in members:
            extra = lengths[index] - shared
            if unit and size + extra > token_budget:
                units.append((shared if len(unit) > 1 else 0, unit))
                unit, size = [], shared
            unit.append(index)
            size += extra
        units.append((shared if len(unit) > 1 else 0, unit))
    return units


def packed_micro_batches(
    rows: Rows, *, token_budget: int, share_trained: bool = False
) -> list[PackedBatch | Rows]:
    """Micro-batches of packed units (longest first, P x S <= budget), as `micro_batches` does
    for rows. A micro-batch whose units share nothing stays plain `Rows` (the ordinary
    causal forward); one with a shared prefix becomes a `PackedBatch`."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lengths = rows.lengths.tolist()
    units = shared_prefix_units(rows, token_budget=token_budget, share_trained=share_trained)

    def size(unit: tuple[int, list[int]]) -> int:
        shared, members = unit
        return shared + sum(lengths[i] - shared for i in members)

    order = sorted(range(len(units)), key=lambda u: (-size(units[u]), u))
    batches: list[list[int]] = []
    for u in order:
        if batches and (len(batches[-1]) + 1) * size(units[batches[-1][0]]) <= token_budget:
            batches[-1].append(u)
        else:
            batches.append([u])
    result: list[PackedBatch | Rows] = []
    for batch in batches:
        chosen = [units[u] for u in batch]
        indices = [i for _, members in chosen for i in members]
        selected = rows.select(indices)
        if all(shared == 0 for shared, _ in chosen):
            result.append(selected)
        else:
            result.append(_pack(selected, [(s, len(m)) for s, m in chosen]))
    return result


def prefix_groups(sequences: list[list[int]]) -> list[int]:
    """A group id per sequence, for rows that come without groups (a Tinker request's datums):
    sequences that begin alike form a group, whose prefix `shared_prefix_units` then shares.

    In lexicographic order (a prompt's samples become neighbours), a sequence joins the group
    before it when they share a first token and joining packs fewer tokens than keeping it
    apart (a shorter common prefix costs every member its difference).
    """
    order = sorted(range(len(sequences)), key=lambda i: sequences[i])
    groups = [0] * len(sequences)
    group, shared = -1, 0
    members: list[int] = []
    for index in order:
        tokens = sequences[index]
        if members:
            first = sequences[members[0]]
            limit = min(shared, len(tokens))
            common = next((p for p in range(limit) if first[p] != tokens[p]), limit)
            apart = shared + sum(len(sequences[m]) - shared for m in members) + len(tokens)
            joined = common + sum(len(sequences[m]) - common for m in [*members, index])
            if common > 0 and joined < apart:
                groups[index], shared = group, common
                members.append(index)
                continue
        group, shared, members = group + 1, len(tokens), [index]
        groups[index] = group
    return groups


def _common_prefix(rows: Rows, members: list[int], lengths: list[int]) -> int:
    shortest = min(lengths[i] for i in members)
    ids = rows.input_ids[members, :shortest]
    same = (ids == ids[:1]).all(0)
    differs = (~same).nonzero()
    return int(differs[0]) if differs.numel() else shortest


def _pack(rows: Rows, units: list[tuple[int, int]]) -> PackedBatch:
    """Lay out `rows` (the units' rows, in unit order) as one packed row per unit."""
    lengths = rows.lengths.tolist()
    spans: list[list[tuple[int, int, int]]] = []  # per unit: (row, packed start, length) of each
    widths: list[int] = []
    row = 0
    for shared, count in units:
        start = shared
        unit_spans = []
        for _ in range(count):
            unit_spans.append((row, start, lengths[row] - shared))
            start += lengths[row] - shared
            row += 1
        spans.append(unit_spans)
        widths.append(start)
    width = max(widths)
    shape = (len(units), width)
    input_ids = torch.zeros(shape, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    segments = torch.full(shape, -1, dtype=torch.long)
    # Packed position of every (row, column) of `rows`: prefix columns map into the prefix.
    where = torch.zeros((rows.num_rows, rows.input_ids.shape[1]), dtype=torch.long)
    where_unit = torch.zeros(rows.num_rows, dtype=torch.long)
    for unit, ((shared, _), unit_spans) in enumerate(zip(units, spans, strict=True)):
        first_row = unit_spans[0][0]
        input_ids[unit, :shared] = rows.input_ids[first_row, :shared]
        position_ids[unit, :shared] = torch.arange(shared)
        segments[unit, :shared] = 0
        for segment, (r, start, length) in enumerate(unit_spans, start=1):
            end = start + length
            input_ids[unit, start:end] = rows.input_ids[r, shared : shared + length]
            position_ids[unit, start:end] = torch.arange(shared, shared + length)
            segments[unit, start:end] = segment
            where[r, :shared] = torch.arange(shared)
            where[r, shared : shared + length] = torch.arange(start, end)
            where_unit[r] = unit
    # The logit predicting token (r, c) sits at the packed position of (r, c - 1).
    trained = rows.trained_mask
    predicting = torch.zeros_like(where)
    predicting[:, 1:] = where[:, :-1]
    first_kept = int(predicting[trained].min()) if trained.any() else 0
    kept = width - first_kept
    source = where_unit[:, None] * kept + (predicting - first_kept)
    source = torch.where(trained, source, 0)
    return PackedBatch(
        rows=rows,
        input_ids=input_ids,
        position_ids=position_ids,
        segments=segments,
        first_kept=first_kept,
        source=source,
    )
