"""Rows that name their own targets: the token the model should predict at every input position.

The Tinker API's training data comes in this shape (a `Datum`: `model_input` tokens plus
`loss_fn_inputs["target_tokens"]`, one target per input position), unlike our `_rows.Rows`,
whose targets are the next input token. Position t of a row scores

    logprob[t] = log p(target_ids[t] | input_ids[0..t])

so a row of n input tokens yields n logprobs, aligned with its targets (for the usual next-token
data, input_ids = tokens[:-1] and target_ids = tokens[1:]). Pure functions, no model: rows ->
micro-batches under a token budget -> padded tensors; `LoraTrainer.score_targets` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


def target_batches(rows: list[TargetRow], *, token_budget: int) -> list[TargetBatch]:
    """The rows, longest first, in padded batches of (rows x longest) <= token_budget tokens.

    Deterministic: equal lengths keep their order. A row longer than the budget is a batch alone.
    """
    groups = longest_first_groups([len(row.input_ids) for row in rows], token_budget)
    return [_padded(rows, group) for group in groups]


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
