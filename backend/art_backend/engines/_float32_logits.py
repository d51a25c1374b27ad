"""Float32 logits from a bf16 or fp16 model: the LM head computed in float32.

A bf16 logit of size 16 to 32 is rounded to a multiple of 0.125, so a token's logprob carries up
to ~0.06 of rounding, and two forwards of the same tokens that differ only in reduction order
(the decode loop's one-row KV-cached step, the trainer's full forward) round to different
neighbours: sampler and trainer logprobs of SmolLM2 in bf16 differed by up to 0.2 (mean 0.03;
`benchmarks/logprob_gap.py`). The hidden state is bf16 either way; computing the head's matmul
in float32 removes the rounding of its output, the largest term. The engine and the trainer
share the model, so both sides get the same head (MiniMax-M1's report, arXiv 2506.13585, traces
its RL's train/inference probability mismatch to the LM head and fixes it the same way).

The float32 copy of the head's weight is made once (the base weights never train: LoRA adapts
other layers) and made again if the weight is replaced or changed in place.
"""

from __future__ import annotations

import types
from typing import Any

import torch


def compute_logits_in_float32(model: Any) -> None:
    """Make `model`'s output embeddings (its LM head) answer float32 logits; a float32 model is
    left as it is."""
    head = model.get_output_embeddings()
    if head is None or head.weight.dtype == torch.float32:
        return
    head._float32_weight = None
    head._float32_key = None
    head.forward = types.MethodType(_float32_forward, head)


def _float32_forward(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    weight = head.weight
    key = (weight.data_ptr(), weight._version, weight.device)
    if head._float32_key != key:
        head._float32_weight = weight.detach().float()
        head._float32_key = key
    bias = head.bias.float() if head.bias is not None else None
    return torch.nn.functional.linear(hidden.float(), head._float32_weight, bias)
