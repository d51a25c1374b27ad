"""The one log-probability path: a label's logprob and its distribution's entropy, from logits.

Every row the trainer scores (a GRPO or SFT step's, a Tinker datum's) goes through these
functions, padded or packed. They follow the alignment of `_rows`: column p of a row holds the
logprob of its label at p, `labels[p]`, predicted by the logits at position p - 1:

    logprob[p] = logits[p - 1][labels[p]] - logsumexp(logits[p - 1])       (float32)
    entropy[p] = logsumexp(logits[p - 1]) - sum_v softmax(logits[p - 1])_v * logits[p - 1]_v

For GRPO and SFT rows the label is the next input token (`Rows.labels` is `input_ids`); a Tinker
datum names its own targets (`Rows.target_ids`). Computed in float32: bf16 logprobs are too
coarse to compare with the sampler's. The entropy carries no gradient (a metric).

`scored_positions` computes them `CHUNK_POSITIONS` positions at a time, by torch's log_softmax
(the sampler's own op: a token's logprob is the same float32 number on both sides, where
logits[label] - logsumexp differed from it in the last bit on an AMX Xeon), with a backward of
its own: (onehot - softmax) x the upstream gradient, chunk by chunk. Autograd through logsumexp
and gather kept several [positions, vocabulary] float32 tensors alive (200 MB each at a GRPO
step's 1,028 kept positions of SmolLM2), and each new one paid its page faults: measured on that
step (bf16, 2 threads), forward+backward 4.70 -> 3.54 s best of 6, peak RSS 3,605 -> 3,095 MB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from art_backend.training._packing import PackedBatch


CHUNK_POSITIONS = 64  # positions per pass over the vocabulary (module docstring)


def scored_positions(
    logits: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs of `labels[m]` under the distribution at `positions[m]` ([M], float32, with a
    gradient to `logits`) and every position's entropy ([N], float32, none), from `logits`
    [N, V]; a position may be scored for several labels (rows sharing a prefix)."""
    if positions.shape != labels.shape:
        raise ValueError(f"{positions.shape[0]} positions for {labels.shape[0]} labels")
    return _ScoredPositions.apply(logits, positions, labels)


def _scored_chunks(
    logits: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen logprobs [M] and every position's entropy [N], in float32, a chunk of
    positions at a time: torch's log_softmax, as the engine's sampler computes its logprobs, so
    the two are the same float32 number for the same logits (ratios of exactly 1 on-policy)."""
    count = logits.shape[0]
    chosen = torch.empty(positions.shape[0], dtype=torch.float32, device=logits.device)
    entropy = torch.empty(count, dtype=torch.float32, device=logits.device)
    order = torch.argsort(positions)
    starts = torch.arange(0, count + CHUNK_POSITIONS, CHUNK_POSITIONS, device=logits.device)
    bounds = torch.searchsorted(positions[order], starts).tolist()  # each chunk's scored labels
    for chunk, start in enumerate(range(0, count, CHUNK_POSITIONS)):
        part = logits[start : start + CHUNK_POSITIONS].float()
        log_probabilities = torch.log_softmax(part, dim=-1)
        # H = -sum_v p_v log p_v
        entropy[start : start + CHUNK_POSITIONS] = -torch.linalg.vecdot(
            log_probabilities.exp(), log_probabilities
        )
        scored = order[bounds[chunk] : bounds[chunk + 1]]
        chosen[scored] = log_probabilities[positions[scored] - start, labels[scored]]
    return chosen, entropy


class _ScoredPositions(torch.autograd.Function):
    """`scored_positions`: no [N, V] temporary beyond the logits' own gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            chosen, entropy = _scored_chunks(logits, positions, labels)
        ctx.save_for_backward(logits, positions, labels)
        ctx.mark_non_differentiable(entropy)
        return chosen, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_chosen: torch.Tensor, _grad_entropy: torch.Tensor
    ) -> tuple[Any, ...]:
        logits, positions, labels = ctx.saved_tensors
        # d chosen_m / d logits[n, v] = [n = position_m] (onehot(label_m)_v - p_n,v)
        per_position = grad_chosen.new_zeros(logits.shape[0], dtype=torch.float32)
        per_position.index_add_(0, positions, grad_chosen.float())
        grad = torch.empty_like(logits, dtype=torch.float32)  # the logits' own dtype at the end
        for start in range(0, logits.shape[0], CHUNK_POSITIONS):
            end = start + CHUNK_POSITIONS
            probabilities = torch.softmax(logits[start:end].float(), dim=-1)
            grad[start:end] = probabilities.mul_(-per_position[start:end, None])
        grad.index_put_((positions, labels), grad_chosen.float(), accumulate=True)
        return grad.to(logits.dtype), None, None


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
    rows, width, vocab = logits.shape
    flat = logits.reshape(-1, vocab)  # a view: the last column is skipped by index, not copied
    columns = torch.arange(width - 1, device=flat.device)
    positions = (torch.arange(rows, device=flat.device)[:, None] * width + columns).reshape(-1)
    targets = labels[:, first_column:].reshape(-1).to(flat.device)
    chosen, entropy = scored_positions(flat, positions, targets)
    chosen, entropy = chosen.view(rows, width - 1), entropy.view(rows, width)[:, :-1]
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
    flat = logits.reshape(-1, logits.shape[-1])
    index = packed.source.to(flat.device)
    labels = packed.rows.labels.to(flat.device)
    chosen, entropy_flat = scored_positions(flat, index.reshape(-1), labels.reshape(-1))
    chosen, entropy = chosen.view(labels.shape), entropy_flat[index]
    trained = packed.rows.trained_mask.to(flat.device)
    return torch.where(trained, chosen, 0.0), torch.where(trained, entropy, 0.0)


def top_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens of each position's distribution: (logprobs, ids), each [..., k],
    most likely first, in float32."""
    logits = logits.float()
    values, ids = torch.topk(logits, k, dim=-1)
    return values - torch.logsumexp(logits, dim=-1, keepdim=True), ids
