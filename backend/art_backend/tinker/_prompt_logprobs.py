"""Prompt logprobs: `include_prompt_logprobs`, `topk_prompt_logprobs` and `compute_logprobs`.

Tinker's `SamplingClient.compute_logprobs(prompt)` is a sample of one token with
`include_prompt_logprobs`; the answer holds one entry per prompt token, `None` (NaN on the wire)
where nothing was scored: the first token (it has no context) and, with `prompt_logprobs_last_n`,
every token before the last N. `topk_prompt_logprobs=k` adds, per position, the k most likely
tokens and their logprobs (sentinel rows, id 0 and -99999, where nothing was scored). Semantics:
the SDK's `SampleRequest` and `SampleResponse` docstrings, and Tinker's sampling page
(https://tinker-docs.thinkingmachines.ai/training-sampling, "Computing logprobs").

The prompt is scored by the trainer's forward, not the decode loop's: one full forward of the
sequence without a KV cache, its logits through `training._logprobs` (the one log-probability
path), routed through the sampler's adapter or the base model. A KL penalty or a distillation
target computed with `compute_logprobs` is then the number `forward` would give for the same
tokens and weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from art_backend._errors import InvalidRequestError
from art_backend.tinker._schemas import SampleRequest
from art_backend.training._logprobs import token_logprobs, top_logprobs

MASK_LOGPROB = -99999.0  # the SDK's sentinel for a top-k slot with nothing in it (TopkLogprobs)


@dataclass(frozen=True)
class PromptLogprobsAsked:
    """What a sample request asks of its prompt: its logprobs, its top k, from which token on."""

    logprobs: bool
    top_k: int
    first_scored: int  # the first prompt position scored (>= 1: position 0 has no context)

    @property
    def anything(self) -> bool:
        """Whether the prompt is scored at all."""
        return self.logprobs or self.top_k > 0


@dataclass(frozen=True)
class PromptLogprobs:
    """A scored prompt, one row per prompt token (NaN / sentinel rows where not scored)."""

    logprobs: np.ndarray | None  # [T] float32
    top_ids: np.ndarray | None  # [T, k] int32
    top_logprobs: np.ndarray | None  # [T, k] float32


def prompt_logprobs_asked(request: SampleRequest, prompt_length: int) -> PromptLogprobsAsked:
    """The request's prompt-logprob options, checked against its prompt (400s naming the field)."""
    asked = bool(request.prompt_logprobs)
    last_n = request.prompt_logprobs_last_n
    if last_n is None:
        return PromptLogprobsAsked(asked, request.topk_prompt_logprobs, 1)
    if not asked:
        raise InvalidRequestError(
            "prompt_logprobs_last_n applies to prompt logprobs; set include_prompt_logprobs "
            "(prompt_logprobs) too, or drop prompt_logprobs_last_n.",
            param="prompt_logprobs_last_n",
        )
    if last_n > prompt_length - 1:
        raise InvalidRequestError(
            f"prompt_logprobs_last_n is {last_n}; a prompt of {prompt_length} tokens has at "
            f"most {prompt_length - 1} scored (its first token has no context). Give 1 to "
            f"{prompt_length - 1}, or None for the whole prompt.",
            param="prompt_logprobs_last_n",
        )
    return PromptLogprobsAsked(asked, request.topk_prompt_logprobs, prompt_length - last_n)


def check_scorable(engine: Any) -> None:
    """A 400 when the engine cannot lend its model to a scorer (vLLM serves samples only)."""
    if not (hasattr(engine, "exclusive") and hasattr(engine, "routed_through")):
        raise InvalidRequestError(
            f"Prompt logprobs (compute_logprobs) are computed by the trainer's forward, which "
            f"this server's {getattr(engine, 'name', 'inference')} engine does not lend; start "
            "art-server with the torch engine to use them.",
            param="include_prompt_logprobs",
        )


@torch.no_grad()
def score_prompt(
    engine: Any, adapter: str | None, prompt: list[int], asked: PromptLogprobsAsked
) -> PromptLogprobs:
    """The prompt's logprobs and top k under `adapter` (None: the base model), by the trainer's
    forward on the engine's model (blocking: run it off the event loop)."""
    length, first = len(prompt), asked.first_scored
    labels = torch.tensor([prompt])
    with engine.exclusive() as model, engine.routed_through(adapter):
        output = model(
            input_ids=labels.to(engine.device),
            attention_mask=torch.ones_like(labels).to(engine.device),
            use_cache=False,
            logits_to_keep=max(length - first + 1, 1),
        )
    logits = output.logits.cpu()
    logprobs = None
    if asked.logprobs:
        scored = token_logprobs(logits, labels, first_column=min(first, length))[0].numpy()
        logprobs = scored.astype(np.float32)
        logprobs[:first] = math.nan
    top_ids = top_values = None
    if asked.top_k > 0:
        k = min(asked.top_k, logits.shape[-1])
        values, ids = top_logprobs(logits[0, :-1], k)
        top_ids = np.zeros((length, k), dtype=np.int32)
        top_values = np.full((length, k), MASK_LOGPROB, dtype=np.float32)
        top_ids[first:] = ids.numpy()
        top_values[first:] = values.numpy()
    return PromptLogprobs(logprobs, top_ids, top_values)
