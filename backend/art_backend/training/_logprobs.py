"""The one log-probability path: a label's logprob and its distribution's entropy, from logits.

Every row the trainer scores (a GRPO or SFT step's, a Tinker datum's) goes through these
functions, padded or packed. They follow the alignment of `_rows`: column p of a row holds the
logprob of its label at p, `labels[p]`, predicted by the logits at position p - 1:

    logprob[p] = logits[p - 1][labels[p]] - logsumexp(logits[p - 1])       (float32)
    entropy[p] = logsumexp(logits[p - 1]) - sum_v softmax(logits[p - 1])_v * logits[p - 1]_v

For GRPO and SFT rows the label is the next input token (`Rows.labels` is `input_ids`); a Tinker
datum names its own targets (`Rows.target_ids`). Computed in float32: bf16 logprobs are too
coarse to compare with the sampler's. The entropy carries no gradient (a metric).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from art_backend.training._packing import PackedBatch


def chosen_logprobs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits)[label] and the entropy of softmax(logits), per position: logits
    [..., V], labels [...] (one label per position)."""
    logits = logits.float()
    log_norm = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_norm
    with torch.no_grad():
        entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return chosen, entropy


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, *, first_column: int = 1
) -> torch.Tensor:
    """log p(labels[:, p] | input_ids[:, :p]) for p >= first_column, aligned with labels.

    `logits` [R, W, V] are the model's outputs at positions first_column - 1 .. T - 1, so
    W = T - first_column + 1: a full forward is W = T with the default first_column = 1; the
    trainer asks the model for the last W positions only (`logits_to_keep`), since prompt
    positions need no logits. Columns before first_column are 0 (never trained).
    """
    return token_logprobs_and_entropy(logits, labels, first_column=first_column)[0]


def token_logprobs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, first_column: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs`, and the entropy of each predicted distribution (no gradient), both
    aligned with labels (columns before first_column are 0)."""
    if first_column < 1:
        raise ValueError("first_column must be >= 1: position 0 has no prediction")
    if logits.shape[1] != labels.shape[1] - first_column + 1:
        raise ValueError(
            f"logits cover {logits.shape[1]} positions; expected "
            f"{labels.shape[1] - first_column + 1} for first_column={first_column}"
        )
    chosen, entropy = chosen_logprobs_and_entropy(logits[:, :-1], labels[:, first_column:])
    pad = (first_column, 0)
    return (
        torch.nn.functional.pad(chosen, pad, value=0.0),
        torch.nn.functional.pad(entropy, pad, value=0.0),
    )


def packed_logprobs_and_entropy(
    logits: torch.Tensor, packed: PackedBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs of the rows' labels and the entropy of their predictions, aligned with
    `packed.rows` (0 where untrained), from the packed forward's kept logits [P, W, V]: every
    row gathers its own labels, from shared prefix positions too."""
    rows, width = packed.input_ids.shape
    if logits.shape[:2] != (rows, width - packed.first_kept):
        raise ValueError(
            f"logits cover {tuple(logits.shape[:2])} positions; expected "
            f"{(rows, width - packed.first_kept)} (the packed rows from first_kept on)"
        )
    flat = logits.reshape(-1, logits.shape[-1]).float()
    log_norm = torch.logsumexp(flat, dim=-1)
    index = packed.source.to(flat.device)
    labels = packed.rows.labels.to(flat.device)
    chosen = flat[index, labels] - log_norm[index]
    with torch.no_grad():
        entropy_flat = log_norm - (torch.softmax(flat, dim=-1) * flat).sum(-1)
        entropy = entropy_flat[index]
    trained = packed.rows.trained_mask.to(flat.device)
    return torch.where(trained, chosen, 0.0), torch.where(trained, entropy, 0.0)


def top_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens of each position's distribution: (logprobs, ids), each [..., k],
    most likely first, in float32 as `chosen_logprobs_and_entropy` computes them."""
    logits = logits.float()
    values, ids = torch.topk(logits, k, dim=-1)
    return values - torch.logsumexp(logits, dim=-1, keepdim=True), ids
