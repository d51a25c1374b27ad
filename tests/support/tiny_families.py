"""Tiny random models of every architecture family users bring, with the tiny ChatML tokenizer.

One table, `FAMILIES`: a family's transformers config class and the fields that make its shape
distinctive (sliding-window layers with a window of 8 tokens, so a short prompt already passes
it; hybrid sliding + full layers; mixture-of-experts blocks). Everything else is the shared tiny
shape of `tests/support/tiny_model.py`. Nothing is downloaded; a model builds in well under a
second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.tiny_model import tiny_tokenizer

WINDOW = 8  # tokens a sliding-window layer attends to: every test prompt is longer
# The shared tiny shape (tests/support/tiny_gguf.py writes its GGUFs in it too).
TINY_SHAPE: dict[str, int] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}


@dataclass(frozen=True)
class Family:
    """A family's config class (by its transformers name) and the fields that shape it."""

    name: str
    config_class: str
    fields: dict[str, Any] = field(default_factory=dict)
    sliding: bool = False  # has sliding-window layers

    def __str__(self) -> str:
        return self.name


FAMILIES = [
    Family("llama", "LlamaConfig"),
    Family("qwen2", "Qwen2Config"),
    Family("qwen3", "Qwen3Config", {"head_dim": 16}),
    # Gemma 3: five sliding layers to one full; here one of each, the window far below a prompt.
    Family(
        "gemma3",
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            # Its embeddings are scaled by sqrt(hidden): tied, a tiny one echoes its input.
            "tie_word_embeddings": False,
        },
        sliding=True,
    ),
    Family("mistral", "MistralConfig", {"sliding_window": WINDOW}, sliding=True),
    Family("phi3", "Phi3Config", {"pad_token_id": None}),
    # SmolLM3: every fourth layer without rotary embeddings (here the second).
    Family("smollm3", "SmolLM3Config", {"no_rope_layers": [1, 0]}),
    Family(
        "qwen3_moe",
        "Qwen3MoeConfig",
        {
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
        },
    ),
    # GPT-OSS: alternating sliding and full layers, attention sinks, experts.
    Family(
        "gpt_oss",
        "GptOssConfig",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0},
        },
        sliding=True,
    ),
]


# A family the torch engine refuses: linear-attention layers carry a recurrent state.
UNSERVABLE = Family(
    "qwen3_next",
    "Qwen3NextConfig",
    {
        "head_dim": 16,
        "layer_types": ["linear_attention", "full_attention"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
    },
)


def build_family_model(
    family: Family,
    folder: Path,
    *,
    seed: int = 0,
    shape: dict[str, int] | None = None,
    head_dim: int | None = None,
) -> Path:
    """Write a tiny random model of `family` and the tiny ChatML tokenizer into `folder`.

    `shape` (hidden_size, heads, kv_heads) and `head_dim` widen it where an engine needs it
    (vLLM's CPU attention: `VLLM_SHAPE`, head sizes of 32 and up).
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(folder)
    sizes: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        **TINY_SHAPE,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
        # transformers' 0.02 makes a tiny tied model echo its last input token: greedy decoding
        # would then agree with anything. At 0.2 the next token depends on the whole context.
        "initializer_range": 0.2,
    }
    if shape is not None:
        sizes["hidden_size"] = shape["hidden_size"]
        sizes["intermediate_size"] = 2 * shape["hidden_size"]
        sizes["num_attention_heads"] = shape["heads"]
        sizes["num_key_value_heads"] = shape["kv_heads"]
    fields = dict(family.fields)
    if head_dim is not None:
        fields["head_dim"] = head_dim
    config = getattr(transformers, family.config_class)(**{**sizes, **fields})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id})
    )
    return folder
