"""Sampling: turn one row of logits into the next token, OpenAI's parameters applied in order.

Order: logit_bias, presence/frequency penalties, grammar mask (applied by the engine), then
temperature, top-k, top-p, and a draw from the row's own generator (so a seed reproduces).
Reported logprobs are those of the model's raw distribution (before any of the above), which is
what the trainer compares its new policy against.
"""

from __future__ import annotations

import torch

from art_backend.serving._engine import SamplingParams


def apply_bias_and_penalties(
    logits: torch.Tensor, params: SamplingParams, token_counts: dict[int, int]
) -> None:
    """Add logit_bias and subtract OpenAI's presence/frequency penalties, in place on a 1-D row."""
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        logits[ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype)
    if token_counts and (params.presence_penalty or params.frequency_penalty):
        ids = torch.tensor(list(token_counts), dtype=torch.long)
        counts = torch.tensor(list(token_counts.values()), dtype=logits.dtype)
        logits[ids] -= params.frequency_penalty * counts + params.presence_penalty


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Draw one token id from a processed 1-D logits row."""
    if params.greedy:
        return int(torch.argmax(logits))
    scaled = logits / params.temperature
    if params.top_k and params.top_k < scaled.numel():
        kth_value = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_value, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_ids = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        remove = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p
        scaled = scaled.scatter(0, sorted_ids[remove], float("-inf"))
    probabilities = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator for one choice: seeded when asked, otherwise from fresh entropy."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
