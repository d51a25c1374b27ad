"""The sampling fields Chat Completions and Completions share, read once into `SamplingParams`.

Both requests name them alike (OpenAI's, plus vLLM's `top_k`, `min_p`, `repetition_penalty`);
each protocol adds what only it has: its length bound, its top-logprobs field, a grammar.
"""

from __future__ import annotations

from typing import Any

from art_backend._errors import InvalidRequestError
from art_backend.engines._engine import SamplingParams


def sampling_params(
    request: Any,
    vocab_size: int,
    *,
    max_new_tokens: int,
    top_logprobs: int,
    grammar: str | None = None,
) -> SamplingParams:
    """`request`'s sampling fields as `SamplingParams`; a `logit_bias` token outside the
    vocabulary is a 400 naming it."""
    logit_bias = {int(token): value for token, value in (request.logit_bias or {}).items()}
    for token in logit_bias:
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"logit_bias names token {token}, outside the vocabulary [0, {vocab_size}).",
                param="logit_bias",
            )
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=max(request.top_k or 0, 0),
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        stop=request.stop_list,
        seed=request.seed,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logit_bias=logit_bias,
        top_logprobs=top_logprobs,
        grammar=grammar,
    )
