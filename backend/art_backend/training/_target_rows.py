"""Rows that name their own targets: the token the model should predict at every input position.

The Tinker API's training data comes in this shape (a `Datum`: `model_input` tokens plus
`loss_fn_inputs["target_tokens"]`, one target per input position), unlike our `_rows.Rows`,
whose targets are the next input token. Position t of a row scores

    logprob[t] = log p(target_ids[t] | input_ids[0..t])

so a row of n input tokens yields n logprobs, aligned with its targets (for the usual next-token
data, input_ids = tokens[:-1] and target_ids = tokens[1:]). Pure functions, no model: rows ->
micro-batches under a token budget -> padded tensors; `LoraTrainer.score_targets` runs them.

The cookbook's RL datums are a group's samples of one prompt, so rows that begin alike are
packed as `_packing` packs a GRPO group (`TargetPack`): the common prefix goes through the model
once, each row's remainder sees it and itself, and each row gathers its own targets' logprobs
from the shared positions' logits. Unlike a GRPO group, a prefix here is not cut at trained
tokens: the gradient of two rows' losses through one shared logit is the sum of their
gradients through two equal ones, so logprobs and gradients equal the padded forward's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from art_backend.training._packing import Segmented
from art_backend.training._rows import longest_first_groups


@dataclass(frozen=True)
class TargetRow:
    """One sequence to score: its input ids and the id to predict at each input position."""

    input_ids: list[int]
    target_ids: list[int]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.target_ids):
            raise ValueError(
                f"{len(self.input_ids)} input tokens but {len(self.target_ids)} targets: "
                "a row needs one target per input position"
            )


@dataclass(frozen=True)
class TargetBatch:
    """Some rows of a request, right-padded to the longest: the tensors of one forward pass."""

    indices: list[int]  # which rows of the request, in this batch's order
    lengths: list[int]
    input_ids: torch.Tensor  # [rows, width], padding 0
    attention_mask: torch.Tensor  # [rows, width], 1 on real tokens
    target_ids: torch.Tensor  # [rows, width], padding 0


@dataclass(frozen=True)
class TargetPack(Segmented):
    """Some rows of a request packed over their shared prefixes (`_packing.Segmented`), one
    packed row per unit. Row `line` of the batch (request row `indices[line]`) reads its
    position t's logit at flat index `where[line, t]` (p * S + s) and scores
    `target_ids[line, t]`; both are 0 past the row's length.
    """

    indices: list[int]
    lengths: list[int]
    where: torch.Tensor
    target_ids: torch.Tensor


# (shared prefix length, request row indices): a unit of one row is all prefix.
Unit = tuple[int, list[int]]


def target_batches(
    rows: list[TargetRow], *, token_budget: int, pack: bool = False
) -> list[TargetBatch | TargetPack]:
    """The rows in micro-batches of at most token_budget tokens (padded rows x width).

    Plain: longest first, padded. With `pack`, rows that share a prefix form units
    (`prefix_units`), and a micro-batch holding a unit of several rows is a `TargetPack`.
    Deterministic. A row or unit longer than the budget is a batch alone.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if not pack:
        groups = longest_first_groups([len(row.input_ids) for row in rows], token_budget)
        return [_padded(rows, group) for group in groups]
    units = prefix_units(rows, token_budget=token_budget)
    sizes = [_unit_size(rows, unit) for unit in units]
    batches: list[TargetBatch | TargetPack] = []
    for group in longest_first_groups(sizes, token_budget):
        chosen = [units[u] for u in group]
        if all(len(members) == 1 for _, members in chosen):
            batches.append(_padded(rows, [members[0] for _, members in chosen]))
        else:
            batches.append(_packed(rows, chosen))
    return batches


def prefix_units(rows: list[TargetRow], *, token_budget: int) -> list[Unit]:
    """Rows that begin alike, as units that carry their common prefix once.

    The rows in lexicographic order of their input ids (a prompt's samples become neighbours);
    a row joins the unit before it when that packs fewer tokens than keeping it apart (a
    shorter common prefix costs every member its difference) and the unit stays within
    `token_budget`.
    """
    order = sorted(range(len(rows)), key=lambda i: rows[i].input_ids)
    units: list[Unit] = []
    for index in order:
        ids = rows[index].input_ids
        if units:
            shared, members = units[-1]
            common = _common_prefix(rows[members[0]].input_ids, ids, shared)
            apart = _unit_size(rows, units[-1]) + len(ids)
            joined = _unit_size(rows, (common, [*members, index]))
            if common > 0 and joined < apart and joined <= token_budget:
                units[-1] = (common, [*members, index])
                continue
        units.append((len(ids), [index]))
    return units


def _common_prefix(first: list[int], second: list[int], limit: int) -> int:
    length = min(limit, len(second))
    for position in range(length):
        if first[position] != second[position]:
            return position
    return length


def _unit_size(rows: list[TargetRow], unit: Unit) -> int:
    shared, members = unit
    return shared + sum(len(rows[index].input_ids) - shared for index in members)


def _packed(rows: list[TargetRow], units: list[Unit]) -> TargetPack:
    """Lay out `units` as one packed row each; their rows in unit order."""
    width = max(_unit_size(rows, unit) for unit in units)
    shape = (len(units), width)
    input_ids = torch.zeros(shape, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    segments = torch.full(shape, -1, dtype=torch.long)
    indices = [index for _, members in units for index in members]
    lengths = [len(rows[index].input_ids) for index in indices]
    where = torch.zeros(len(indices), max(lengths), dtype=torch.long)
    target_ids = torch.zeros(len(indices), max(lengths), dtype=torch.long)
    line = 0
    for unit, (shared, members) in enumerate(units):
        base = unit * width
        input_ids[unit, :shared] = torch.tensor(rows[members[0]].input_ids[:shared])
        position_ids[unit, :shared] = torch.arange(shared)
        segments[unit, :shared] = 0
        start = shared
        for segment, index in enumerate(members, start=1):
            row = rows[index]
            end = start + len(row.input_ids) - shared
            input_ids[unit, start:end] = torch.tensor(row.input_ids[shared:], dtype=torch.long)
            position_ids[unit, start:end] = torch.arange(shared, len(row.input_ids))
            segments[unit, start:end] = segment
            where[line, :shared] = base + torch.arange(shared)
            where[line, shared : len(row.input_ids)] = base + torch.arange(start, end)
            target_ids[line, : len(row.input_ids)] = torch.tensor(row.target_ids)
            start, line = end, line + 1
    return TargetPack(
        input_ids=input_ids,
        position_ids=position_ids,
        segments=segments,
        indices=indices,
        lengths=lengths,
        where=where,
        target_ids=target_ids,
    )


def _padded(rows: list[TargetRow], indices: list[int]) -> TargetBatch:
    lengths = [len(rows[index].input_ids) for index in indices]
    width = max(lengths)
    input_ids = torch.zeros(len(indices), width, dtype=torch.long)
    target_ids = torch.zeros(len(indices), width, dtype=torch.long)
    attention_mask = torch.zeros(len(indices), width, dtype=torch.long)
    for line, (index, length) in enumerate(zip(indices, lengths, strict=True)):
        input_ids[line, :length] = torch.tensor(rows[index].input_ids)
        target_ids[line, :length] = torch.tensor(rows[index].target_ids)
        attention_mask[line, :length] = 1
    return TargetBatch(indices, lengths, input_ids, attention_mask, target_ids)


def target_logprobs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[target] at every position, in float32: [rows, width]."""
    logits = logits.float()
    chosen = logits.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def packed_target_logprobs(logits: torch.Tensor, pack: TargetPack) -> torch.Tensor:
    """`target_logprobs` of a pack's rows, [rows, longest], from its packed forward's logits
    [P, S, V]: every row gathers its own targets, shared positions included."""
    if logits.shape[:2] != pack.input_ids.shape:
        raise ValueError(
            f"logits cover {tuple(logits.shape[:2])} positions; expected "
            f"{tuple(pack.input_ids.shape)} (every packed position)"
        )
    flat = logits.reshape(-1, logits.shape[-1]).float()
    where = pack.where.to(flat.device)
    log_norm = torch.logsumexp(flat, dim=-1)
    return flat[where, pack.target_ids.to(flat.device)] - log_norm[where]
