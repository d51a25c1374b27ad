"""Sampling: turn one row of logits into the next token, OpenAI's parameters applied in order.

Order: logit_bias, presence/frequency penalties, grammar mask (applied by the engine), then
temperature, top-k, top-p, and a draw from the row's own generator (so a seed reproduces).
Reported logprobs are those of the model's raw distribution (before any of the above), which is
what the trainer compares its new policy against.
"""

from __future__ import annotations

import torch

from art_backend.engines._engine import SamplingParams


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
    # Shift so the best logit is 0, and divide in float64 (where 1e-320 is not 0): a temperature
    # near zero then sends the others to -inf, a greedy draw (the limit as T -> 0), not NaN.
    scaled = (logits.double() - logits.max().double()) / params.temperature
    if params.top_k and params.top_k < scaled.numel():
        kth_value = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_value, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_ids = torch.sort(scaled, descending=True)
        probabilities = torch.softmax(sorted_logits, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p. The best token always stays: a
        # top_p below float32's smallest number (5e-324) would otherwise remove every token.
        remove = probabilities.cumsum(dim=-1) - probabilities >= params.top_p
        remove[0] = False
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
