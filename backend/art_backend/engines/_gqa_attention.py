"""transformers' SDPA attention with a one-query step's grouped heads kept grouped when compiled.

For a decode step (one query per row) of a model whose query heads share key heads (GQA),
transformers' SDPA attention regroups the queries by key head (`pack_gqa`, a view) in eager
mode, but while compiling it repeats every key and value head for its query heads
(`repeat_kv`): a copy of the whole cache every step. In a compiled SmolLM2 step (3 key heads
for 9 query heads, 16 rows x 128 columns, float32) those copies were most of the graph's own
31 ms, and the step served 117-128 tok/s against eager's 148-154; grouped, 161-164.

`ATTENTION` ("art_sdpa") is transformers' SDPA attention in every other case (prefill, the
trainer, no grouped heads, eager), so the same values: the compiled step (`_compiled_step.py`)
switches a model from "sdpa" to it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

ATTENTION = "art_sdpa"


def use_grouped_attention(model: Any) -> bool:
    """Switch `model` from transformers' "sdpa" attention to `ATTENTION`; False where it runs
    another attention (kept)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "_attn_implementation", None) != "sdpa":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    base.set_attn_implementation(ATTENTION)
    return True


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
    from transformers.integrations.sdpa_attention import pack_gqa, sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (
        groups == 1
        or query.shape[2] != 1
        or not torch.compiler.is_compiling()
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    # [rows, key heads, groups, dim]: each key head's queries as that head's `groups` queries.
    grouped = pack_gqa(query, groups)
    assert grouped is not None
    output = functional.scaled_dot_product_attention(
        grouped,
        key,
        value,
        attn_mask=pack_gqa(attention_mask, groups),
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
    )
    output = output.reshape(output.shape[0], -1, 1, value.shape[-1])
    return output.transpose(1, 2).contiguous(), None
