"""Float32 logits from a bf16 or fp16 model: the LM head computed in float32.

A bf16 logit of size 16 to 32 is rounded to a multiple of 0.125, so a token's logprob carries up
to ~0.06 of rounding, and two forwards of the same tokens that differ only in reduction order
(the decode loop's one-row KV-cached step, the trainer's full forward) can round to different
neighbours. Computing the head's matmul in float32 removes that rounding: on SmolLM2 in bf16 the
mean |sampler - trainer| fell from 0.028-0.040 to 0.025-0.032 and the first token's largest gap
by half (`benchmarks/logprob_gap.py`); the rest comes from the bf16 layers below the head. The
engine and the trainer share the model, so both sides get the same head (MiniMax-M1's report,
arXiv 2506.13585, traces its RL's train/inference probability mismatch to the LM head's
precision and computes it in float32).

The float32 copy of the head's weight is made once (the base weights never train: LoRA adapts
other layers) and made again if the weight is replaced or changed in place. On a CPU it is kept
only packed for oneDNN (`_packed_linear`), not also dense.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from art_backend.engines._packed_linear import pack_weight, packed_linear, packing_on


def compute_logits_in_float32(model: Any) -> None:
    """Make `model`'s output embeddings (its LM head) answer float32 logits; a float32 model is
    left as it is."""
    head = model.get_output_embeddings()
    if head is None or head.weight.dtype == torch.float32:
        return
    head._float32_weight = None
    head._float32_key = None
    head._float32_packed = None
    head.forward = types.MethodType(_float32_forward, head)


def refresh_head(model: Any) -> None:
    """Make `model`'s float32 head current with its weight, as its next eager call would: what
    a compiled step (`_compiled_step.py`), which cannot read a storage pointer, reads."""
    head = model.get_output_embeddings()
    if head is not None and "_float32_key" in vars(head):
        _refresh(head)


def _refresh(head: Any) -> None:
    weight = head.weight
    key = (weight.data_ptr(), weight._version, weight.device)
    if head._float32_key != key:
        # Made outside inference mode even when the first call is the engine's (inference)
        # forward: an inference tensor cannot be saved for the trainer's backward.
        with torch.inference_mode(False):
            full = weight.detach().float()
            packed = pack_weight(full) if packing_on() else None
        # Packed, the dense float32 copy is not kept (SmolLM2's: 113 MB): the forward reads the
        # packed one, the backward the model's own weight.
        head._float32_packed = packed
        head._float32_weight = full if packed is None else None
        head._float32_key = key


def _float32_forward(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    weight = head.weight
    if not torch.compiler.is_compiling():  # a compiled step refreshed it before (refresh_head)
        _refresh(head)
    bias = head.bias.float() if head.bias is not None else None
    if head._float32_packed is not None:  # oneDNN's packed float32 kernel (_packed_linear)
        # The backward in the model's dtype: the hidden state's gradient is rounded to it anyway
        # (SmolLM2's head backward 2.4x faster in bf16 than in float32 here).
        return packed_linear(hidden.float(), head._float32_packed, bias, weight.detach())
    return torch.nn.functional.linear(hidden.float(), head._float32_weight, bias)
