"""Linear layers for a decode step's few rows: `W @ Xᵀ` instead of `X @ Wᵀ` in float32 on a CPU.

A decode step runs every linear layer on one row per sequence. With 16 rows, MKL's float32 GEMM
for `X @ Wᵀ` ([16, in] x [in, out]) reads each weight matrix at about 8 GB/s; the same product
computed as `(W @ Xᵀ)ᵀ` ([out, in] x [in, 16], the weight as the GEMM's left operand, no copy of
it) takes another kernel. Measured on the 2-core AMD EPYC, quiet, 2 threads, SmolLM2-135M's 211
linear shapes with distinct weights per layer (the weights streamed from memory, as in a real
step), bests of 5: 16 rows 67.0 -> 55.6 ms, 64 rows 137 -> 120 ms; bf16 30.4 -> 28.0 and
61 -> 53 ms (not taken: bf16 models keep `_batch_invariant.py`'s row floor, whose kernel
choice the sampler's logprobs depend on).

So, for a float32 model on a CPU, every plain `nn.Linear` (PEFT's LoRA layers included) takes
the transposed product when it runs without gradients on at most `ROWS` rows of float32: the
engine's decode steps and short scoring passes. Training (gradients on) and prefills of more
rows keep `nn.functional.linear`. The two differ by float32 rounding only (another summation
order); greedy tokens still equal `generate()`'s on every family of the test matrix.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from art_backend.engines._batch_invariant import floor_linear_rows, is_batch_invariant

ROWS = 64  # the most input rows that take the transposed product


def fit_linear_layers(model: Any) -> None:
    """Give `model`'s linear layers the forward its dtype decodes fastest with, bit-identical
    where the sampler needs it: the batch-invariant row floor (bf16/fp16, `_batch_invariant`) or
    the transposed decode product (float32 on a CPU). Call again after PEFT adds layers;
    idempotent."""
    if is_batch_invariant(model):
        floor_linear_rows(model)
        return
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return
    for module in model.modules():
        # A layer whose forward is already replaced keeps it.
        if type(module) is nn.Linear and "forward" not in vars(module):
            module.forward = types.MethodType(_decode_forward, module)  # type: ignore[method-assign]


def _decode_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (
        0 < rows <= ROWS
        and x.dtype == torch.float32
        and self.weight.dtype == torch.float32
        and not torch.is_grad_enabled()
    ):
        out = (self.weight @ x.reshape(rows, -1).t()).t()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
    return nn.functional.linear(x, self.weight, self.bias)
