"""Batch-invariant forwards for a bf16 or fp16 model on a CPU: a token's logprob is the same
whichever tokens share its forward, so the sampler's logprobs are the trainer's.

The engine scores a sampled token in a KV-cached decode step (one query per row, rows
left-padded to a common length); the trainer scores it in one forward of the whole sequence
(rows right-padded, or packed behind a shared prefix). In bf16 every op rounds its output to 8
bits of mantissa, so any two computations of the same value that differ in summation order can
round to neighbouring bf16 values, and one such difference grows through the layers: on
SmolLM2 the sampler's logprobs and the trainer's differed by 0.025-0.033 on average
(`benchmarks/logprob_gap.py`). Measured op by op (layer outputs of a decode step against the full
forward), the differences come from exactly two places:

- **Linear layers: the row count picks the kernel.** oneDNN's bf16 matmul takes another
  kernel (another summation order) for one row than for two or more, and a decode step of one
  sequence, or one adapter's rows in a mixed-adapter batch, is one row. On an AMD EPYC its
  results for two rows or more were equal bit for bit, whatever the row count (2 to 2,048); on
  an Intel Xeon with AMX, calls of 33 rows or more take AMX kernels whose sums differ from the
  small calls' in a few rows, by shape and row count (SmolLM2's 1536x576 layer from 33 rows,
  576x576 from 48, 192x576 from 77): the trainer's forward of ~500 rows and the sampler's
  16-row decode differed there by 0.025 a token on average (`benchmarks/logprob_gap.py`,
  2026-12-06). A LoRA adapter's layers run in float32 (PEFT keeps adapter weights in float32
  under a bf16 model), where fewer than 16 rows take other kernels, and on that Xeon so do
  calls past ~600k inputs (380-510 rows of 2,048-1,536 features). Calls of the same row count give a row the same bits wherever it sits in the call,
  and calls of a dtype's floor (2 in bf16 and fp16, 16 in float32) to `ROW_CEILING` (32) rows
  agreed with each other on both machines. So every linear layer runs its rows in calls of that
  range: fewer than the floor padded with zero rows to it, more than the ceiling in blocks of
  it (`_blocked`), the last block padded to the floor.
- **Attention.** SDPA's CPU kernel blocks its reductions by the key length, and the softmax
  and the probabilities-times-values sums of a left-padded decode row, a right-padded trainer
  row and a packed row run over the same terms in different orders. Here scores, softmax and
  the weighted sum are computed in float64: the dot products of bf16 values are exact there, and
  a float64 sum's order changes it by ~1e-16, far below a bf16 rounding step, so every layout
  rounds to the same bf16 output. The backward (training) recomputes the probabilities in
  float32 and takes the gradient by matmuls (`attention_gradients`): only the forward's values
  need to be the same everywhere, and this takes half the time of recomputing transformers'
  SDPA and taking its bf16 gradient (4.6 against 9.0 ms a layer on a GRPO step's packed SmolLM2
  rows, profiled). Under a per-query mask (a prompt's causal one, a packed row's) queries go
  `SPARSE_QUERIES` at a time over only the keys some query of the block attends to
  (`_attended`): a packed row's completions see their prompt and themselves, not each other, so
  a block of them computes over ~40 % of the row's keys. On a GRPO step of 4 packed rows (a
  64-token prompt and 4 completions of 64) the trainer's forward+backward took 2.1-2.4 s instead
  of 2.9 s, best of 6 (bf16, 2 threads, 2026-12-06). A causal prompt with no mask (one
  unpadded request) goes the same way, each block over the keys up to its last query's: a
  2,048-token prompt's attention took 4.8 s instead of 13.3 on SmolLM2 (2 threads of an AMD
  EPYC, 2026-12-07; its first token 5.5 s instead of 15). A sliding-window layer's decode step
  likewise reads only the columns its rows' windows reach (`_in_window`).

With both, the engine's logprobs of its own samples equal the trainer's forward on the same
tokens bit for bit in bf16 on SmolLM2 (single and batched, left-padded decode against right-
padded and packed training rows). This is the batch invariance of "Defeating Nondeterminism in
LLM Inference" (Thinking Machines, 2025: https://thinkingmachines.ai/blog/defeating-
nondeterminism-in-llm-inference/), obtained here from float64 attention and row floors
instead of custom kernels. A float32 model is left as it is: its gap is ~1e-5.

`ART_BATCH_INVARIANT=0` (or false/no/off) keeps SDPA and the one-row kernel, for a measurement
of what the invariance costs (`benchmarks/logprob_gap.py`); any other value than those and
1/true/yes/on is refused at start, naming the variable.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from art_backend.engines._packed_linear import linear, row_kernel
from art_backend.engines._sibling_linear import Kernel, sibling_output
from art_backend.engines._switches import env_switch

ATTENTION = "art_batch_invariant"
VARIABLE = "ART_BATCH_INVARIANT"
REDUCED = (torch.bfloat16, torch.float16)
BLOCK_BYTES = 256 * 2**20  # float64 scores + probabilities of one block of queries
# A decode step's float64 keys + values of a chunk of rows (`_in_rows`)
ROW_CHUNK_BYTES = 16 * 2**20
SPARSE_QUERIES = 64  # queries per block under a per-query mask (`_attended`) ...
SPARSE_MIN_QUERIES = 128  # ... from this many queries (a small prompt's one block is cheaper)
SPARSE_SHARE = 0.75  # a block attending to more of the keys than this computes over all
Columns = torch.Tensor | slice | None  # key columns: indices, a run of them, or all (None)
# The fewest rows a linear layer's matmul runs with, by its input's dtype, and the most
# (module docstring): every call within both takes the same kernel for a given row.
ROW_FLOOR = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 16}
ROW_CEILING = 32
FLOAT32_CEILING_ELEMENTS = 2**18  # MKL's float32 kernels change past ~600k (rows x in_features)


def make_batch_invariant(model: Any) -> bool:
    """Switch a bf16/fp16 model on a CPU to batch-invariant attention and linear layers; returns
    whether it did (False for a float32 model, a GPU, or attention other than SDPA)."""
    if not wants_batch_invariance(model) or not switched_on():
        return False
    _register()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(ATTENTION)
    floor_linear_rows(model)
    return True


def wants_batch_invariance(model: Any) -> bool:
    """Whether `model` runs in reduced precision on a CPU with transformers' SDPA attention."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu" or parameter.dtype not in REDUCED:
        return False
    return getattr(model.config, "_attn_implementation", None) in ("sdpa", ATTENTION)


def switched_on() -> bool:
    """`ART_BATCH_INVARIANT`: on unless 0/false/no/off; another value is a `ModelLoadError`."""
    return env_switch(VARIABLE, default=True)


def is_batch_invariant(model: Any) -> bool:
    """Whether `make_batch_invariant` switched `model`."""
    return getattr(model.config, "_attn_implementation", None) == ATTENTION


def floor_linear_rows(model: Any) -> None:
    """Give every plain `nn.Linear` of a batch-invariant model its dtype's row floor (see the
    module docstring); called again after PEFT adds adapter layers. Idempotent."""
    if not is_batch_invariant(model):
        return
    for module in model.modules():
        # A layer whose forward is already replaced (the float32 LM head) keeps it.
        if type(module) is nn.Linear and "forward" not in vars(module):
            module.forward = types.MethodType(_floored_forward, module)  # type: ignore[method-assign]


def one_call(x: torch.Tensor) -> bool:
    """Whether a floored layer runs `x` in one call (its rows between the floor and the
    ceiling, or a dtype without a floor)."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    floor = ROW_FLOOR.get(x.dtype, 0)
    return not floor or rows == 0 or floor <= rows <= _ceiling(x.dtype, width)


def _floored_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    grouped = sibling_output(self, x, _floored_group)  # q/k/v, gate/up: one call
    if grouped is not None:
        return grouped
    if one_call(x):
        return linear(self, x)
    width = x.shape[-1]
    rows = x.numel() // width
    flat = x.reshape(rows, width)
    if torch.is_grad_enabled() and _wants_grad(self, x):
        out = _BlockedLinear.apply(flat, self.weight, self.bias, self)
    else:
        out = _blocked(self, flat)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _wants_grad(layer: nn.Linear, x: torch.Tensor) -> bool:
    tensors = (x, layer.weight, layer.bias)
    return any(t is not None and t.requires_grad for t in tensors)


def _floored_group(kernel: Kernel, x: torch.Tensor) -> torch.Tensor:
    """A sibling group's output on `x` through `kernel`, in the row floor's calls."""
    if one_call(x):
        return kernel(x)
    width = x.shape[-1]
    out = _blocks(kernel, x.reshape(x.numel() // width, width))
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _blocked(layer: nn.Linear, flat: torch.Tensor) -> torch.Tensor:
    """`layer` on [rows, in] in calls of `ROW_FLOOR` to `_ceiling` rows (zero rows pad a short
    one to the floor), into one [rows, out] result."""
    return _blocks(row_kernel(layer, flat), flat)


def _blocks(kernel: Kernel, flat: torch.Tensor) -> torch.Tensor:
    """`kernel` on [rows, in] in calls of `ROW_FLOOR` to `_ceiling` rows (`_blocked`)."""
    rows, floor = flat.shape[0], ROW_FLOOR[flat.dtype]
    step = _ceiling(flat.dtype, flat.shape[1])
    flat = flat.contiguous()
    parts = [kernel(flat[start : start + step]) for start in range(0, rows - floor + 1, step)]
    done = sum(part.shape[0] for part in parts)
    if done < rows:  # a tail shorter than the floor
        padded = flat.new_zeros((floor, flat.shape[1]))
        padded[: rows - done] = flat[done:]
        parts.append(kernel(padded)[: rows - done])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _ceiling(dtype: torch.dtype, width: int) -> int:
    """The most rows of `width` inputs one call takes: `ROW_CEILING` in bf16/fp16; in float32
    (a LoRA's layers) `FLOAT32_CEILING_ELEMENTS` of input, at least the floor."""
    if dtype != torch.float32:
        return ROW_CEILING
    return max(ROW_FLOOR[torch.float32], FLOAT32_CEILING_ELEMENTS // max(width, 1))


class _BlockedLinear(torch.autograd.Function):
    """`_blocked`'s forward (the invariant values); the backward in whole matmuls (the
    gradients need no invariance): the input's, and the weight's and bias's where they train."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        flat: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        layer: nn.Linear,
    ) -> torch.Tensor:
        ctx.save_for_backward(flat if weight.requires_grad else None, weight)
        ctx.has_bias = bias is not None
        with torch.no_grad():
            return _blocked(layer, flat)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        flat, weight = ctx.saved_tensors
        wants_input, wants_weight, wants_bias, _ = ctx.needs_input_grad
        input_grad = grad @ weight if wants_input else None
        weight_grad = grad.t() @ flat if wants_weight and flat is not None else None
        bias_grad = grad.sum(0) if wants_bias and ctx.has_bias else None
        return input_grad, weight_grad, bias_grad, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # SDPA's masks, as the backward uses


def _attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (dropout and module.training) or kwargs.get("position_bias") is not None:
        # Not batch-invariant, and never used by the decoder-only models served here.
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        output = _InvariantAttention.apply(module, query, key, value, attention_mask, scale, causal)
    else:
        if attention_mask is not None and _sliding(module, query):
            key, value, attention_mask = _in_window(key, value, attention_mask)
        output = float64_attention(query, key, value, attention_mask, scale, causal)
    return output.transpose(1, 2).contiguous(), None


def _sliding(module: Any, query: torch.Tensor) -> bool:
    """A sliding-window layer's few queries (a decode step's): their keys are narrowed to the
    windows (`_in_window`). Longer prompts go through `_query_blocks`' own narrowing."""
    return bool(getattr(module, "sliding_window", None)) and query.shape[2] < SPARSE_MIN_QUERIES


def _in_window(
    key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys, values and mask narrowed to the columns some query attends to, where they are
    one run of at most `SPARSE_SHARE` of the keys (views, no copy); else as they are.

    A sliding layer's cache keeps every token (`_kv_cache.py`) and the mask keeps the window:
    a decode step over Gemma 3's 64-token window and a 184-token cache cast and summed all 184
    columns of each row in float64. A masked key adds exactly 0 to a query's sums, so leaving
    it out changes a float64 sum's order only (the module docstring's argument)."""
    mask = mask[..., : key.shape[2]]
    columns = _attended(mask)
    if not isinstance(columns, slice):
        return key, value, mask
    return _keys(key, columns), _keys(value, columns), _keys(mask, columns, dim=-1)


def float64_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """Attention of [B, H, Q, D] queries over [B, Hkv, K, D] keys and values, computed in
    float64 and rounded once to the queries' dtype. `mask`: SDPA's (boolean, True = attend, or
    additive), broadcast over heads; `causal` aligns the queries with the last keys.

    Queries go in blocks whose float64 scores and probabilities stay within `BLOCK_BYTES` (a
    long prompt's [Q, K] scores would not): a query's output does not depend on its block (its
    scores are exact sums; the rest is row by row).
    """
    batch, heads, queries, _ = query.shape
    keys = key.shape[2]
    offset = keys - queries if causal else None
    per_query = batch * heads * keys * 8 * 2
    blocks = list(_query_blocks(query, mask, max(1, BLOCK_BYTES // per_query), offset))
    if len(blocks) == 1 and blocks[0][3] is None:
        return _in_rows(query, key, value, mask, scale, offset)
    # Cast once for every block (a block's keys are views or a gather of these).
    key, value = key.double(), value.double()
    parts = [
        _float64_block(
            rows, _keys(key, columns), _keys(value, columns), part_mask, scale,
            None if offset is None else offset + start,
        )
        for start, rows, part_mask, columns in blocks
    ]  # fmt: skip
    return torch.cat(parts, dim=2)


def _in_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    diagonal: int | None,
) -> torch.Tensor:
    """`_float64_block` over chunks of rows whose float64 keys and values stay within
    `ROW_CHUNK_BYTES`: a decode step of 16 rows over 1,060 columns cast 52 MB of them a layer,
    over 2,100 columns 103 MB, each a fresh mapping of memory written and read back. In chunks
    a layer's attention took 3.0 instead of 5.4 ms at 1,060 columns, 6.6 instead of 43.8 at
    2,100 (2 threads of the AMD EPYC, 2026-12-07; the same bits: a row's sums are its own)."""
    batch, kv_heads, keys, dim = key.shape
    rows = max(1, ROW_CHUNK_BYTES // (kv_heads * keys * dim * 8 * 2))
    if batch <= rows:
        return _float64_block(query, key, value, mask, scale, diagonal)
    parts = []
    for start in range(0, batch, rows):
        part = slice(start, start + rows)
        part_mask = mask if mask is None or mask.shape[0] == 1 else mask[part]
        parts.append(
            _float64_block(query[part], key[part], value[part], part_mask, scale, diagonal)
        )
    return torch.cat(parts)


def _query_blocks(
    query: torch.Tensor, mask: torch.Tensor | None, block: int, offset: int | None = None
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None, Columns]]:
    """(first query, the block's queries, the block's rows of a per-query mask, the key columns
    they attend to or None for all) by `block`, or by `SPARSE_QUERIES` under a per-query mask:
    then a block whose queries leave keys out computes over the others only (`_attended`)."""
    queries = query.shape[2]
    per_query = mask is not None and mask.shape[-2] == queries
    sparse = (per_query or offset is not None) and queries >= SPARSE_MIN_QUERIES
    if sparse:
        block = min(block, SPARSE_QUERIES)
    for start in range(0, queries, block):
        part_mask, columns = mask, None
        if mask is not None and per_query:
            part_mask = mask[..., start : start + block, :]
            columns = _attended(part_mask) if sparse else None
            if columns is not None:
                part_mask = _keys(part_mask, columns, dim=-1)
        elif sparse and offset is not None:  # causal: up to the block's last query's key
            columns = slice(0, min(queries, start + block) + offset)
        yield start, query[:, :, start : start + block], part_mask, columns


def _attended(mask: torch.Tensor) -> Columns:
    """The key columns that some query of `mask` ([B, 1 or H, Q, K], SDPA's) attends to, where
    they are at most `SPARSE_SHARE` of them, as a slice where they are one run (a causal
    prompt's block: a view of the keys, no copy); None: compute over all.

    A packed GRPO row's completions attend to their prompt and themselves, not to each other:
    4 completions of 64 tokens behind a 64-token prompt leave a block of queries ~40 % of the
    keys. A masked key adds exactly 0 to a query's sums, so leaving it out changes a float64
    sum's order only (the module docstring's argument).
    """
    keys = mask.shape[-1]
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    used = allowed.reshape(-1, keys).any(dim=0).nonzero().squeeze(1)
    if len(used) > SPARSE_SHARE * keys:
        return None
    if len(used) and int(used[-1]) - int(used[0]) + 1 == len(used):  # one run: a view, no copy
        return slice(int(used[0]), int(used[-1]) + 1)
    return used


def _keys(tensor: torch.Tensor, columns: Columns, dim: int = 2) -> torch.Tensor:
    """[B, Hkv, K, D] keys or values (or a mask's last dimension) at `columns` (None: all)."""
    if columns is None:
        return tensor
    if isinstance(columns, slice):
        return tensor.narrow(dim, columns.start, columns.stop - columns.start)
    return tensor.index_select(dim, columns)


def _float64_block(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    diagonal: int | None,
) -> torch.Tensor:
    """`float64_attention` of a block of queries (`diagonal`: `_grouped_probabilities`')."""
    batch, heads, queries, dim = query.shape
    probs = _grouped_probabilities(query.double(), key.double(), mask, scale, diagonal)
    out = probs @ value.double()
    return out.view(batch, heads, queries, dim).to(query.dtype)


def _grouped_probabilities(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    diagonal: int | None,
) -> torch.Tensor:
    """The attention probabilities of [B, H, Q, D] queries over [B, Hkv, K, D] keys, in the
    inputs' dtype, as [B, Hkv, G * Q, K]: grouped-query attention without repeating the keys,
    each key head's G query heads being rows of one matmul. `diagonal`: causal, query q
    attends keys up to `diagonal + q`; None: not causal."""
    batch, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, groups * queries, dim)
    # In place from the scores on: each pass over [B, Hkv, G * Q, K] writes no new tensor (at a
    # GRPO step's packed rows a new one is tens of MB, and its first touch costs page faults).
    scores = (grouped @ key.transpose(-1, -2)).mul_(scale)
    scores = scores.view(batch, kv_heads, groups, queries, keys)
    if diagonal is not None and diagonal + 1 < keys:  # every query sees the keys up to diagonal
        first = max(diagonal + 1, 0)
        last = torch.arange(diagonal, diagonal + queries, device=query.device)[:, None]
        hidden = torch.arange(first, keys, device=query.device)[None, :] > last
        scores[..., first:].masked_fill_(hidden, float("-inf"))
    if mask is not None:
        mask = mask[..., :keys]
        if mask.shape[1] == 1:
            mask = mask.unsqueeze(2)  # [B, 1, 1, Q, K]: the same for every head
        else:  # a per-head mask: [B, H, Q, K] -> [B, Hkv, G, Q, K]
            mask = mask.reshape(mask.shape[0], kv_heads, groups, *mask.shape[-2:])
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.to(scores.dtype))
    # A query that may attend to nothing (a padding row) gets zeros, not NaN. (torch's softmax
    # rather than exp_ in place: its float64 exp is vectorised, twice as fast here.)
    scores = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
    return scores.view(batch, kv_heads, groups * queries, keys)


def attention_gradients(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of `float64_attention`'s output, `grad` ([B, H, Q, D]), with respect to its
    query, key and value, computed in float32 from recomputed probabilities and returned in the
    inputs' dtypes. Queries go in blocks within `BLOCK_BYTES`, as in the forward.

    With P the probabilities and dO the output's gradient: dV = P^T dO, dS = P * (dO V^T -
    rowsum(P * dO V^T)), dQ = scale dS K, dK = scale dS^T Q (the key head's G query heads
    summed by the grouped layout's matmuls).
    """
    batch, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    key32, value32 = key.float(), value.float()
    key_grad = torch.zeros(batch, kv_heads, keys, dim, dtype=torch.float32, device=key.device)
    value_grad = torch.zeros_like(key_grad)
    block = max(1, BLOCK_BYTES // (batch * heads * keys * 4 * 3))
    offset = keys - queries if causal else None
    query_grads = []
    for start, block_queries, part_mask, columns in _query_blocks(query, mask, block, offset):
        rows = block_queries.float()
        count = rows.shape[2]
        keys32, values32 = _keys(key32, columns), _keys(value32, columns)
        diagonal = None if offset is None else offset + start
        probs = _grouped_probabilities(rows, keys32, part_mask, scale, diagonal)
        upstream = grad[:, :, start : start + count].float()
        upstream = upstream.reshape(batch, kv_heads, groups * count, dim)
        _add_at(value_grad, columns, probs.transpose(-1, -2) @ upstream)
        weights = upstream @ values32.transpose(-1, -2)
        # dS = P * (W - rowsum(P * W)), written over W
        rowsum = (probs * weights).sum(-1, keepdim=True)
        scores_grad = weights.sub_(rowsum).mul_(probs)
        query_grads.append((scores_grad @ keys32 * scale).view(batch, heads, count, dim))
        grouped = rows.reshape(batch, kv_heads, groups * count, dim)
        _add_at(key_grad, columns, scores_grad.transpose(-1, -2) @ grouped * scale)
    query_grad = torch.cat(query_grads, dim=2) if len(query_grads) > 1 else query_grads[0]
    return query_grad.to(query.dtype), key_grad.to(key.dtype), value_grad.to(value.dtype)


def _add_at(total: torch.Tensor, columns: Columns, part: torch.Tensor) -> None:
    """total[:, :, columns] += part (all columns for None)."""
    if columns is None:
        total += part
    elif isinstance(columns, slice):
        total[:, :, columns] += part
    else:
        total.index_add_(2, columns, part)


class _InvariantAttention(torch.autograd.Function):
    """Forward: `float64_attention`. Backward: `attention_gradients` (the probabilities
    recomputed in float32; nothing of the float64 forward is kept)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
        causal: bool,
    ) -> torch.Tensor:
        ctx.scale, ctx.causal = scale, causal
        ctx.save_for_backward(query, key, value, mask)
        return float64_attention(query, key, value, mask, scale, causal)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        query, key, value, mask = ctx.saved_tensors
        grads = attention_gradients(query, key, value, mask, ctx.scale, ctx.causal, grad)
        wanted = ctx.needs_input_grad[1:4]
        return (
            None,
            *(g if w else None for g, w in zip(grads, wanted, strict=True)),
            None,
            None,
            None,
        )
