"""Two LoRA trainers from one seed on one tiny engine, one packing shared prefixes and one not:
the packing tests compare what each computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.support.tiny_model import build_tiny_model


def twin_trainers(folder: Path, *, seed: int) -> tuple[Any, Any]:
    """(packed, padded) LoraTrainers on the tiny Llama (SDPA, RoPE: it packs), equal at start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from art_backend.testing import LoraTrainer, TorchEngine

    model_dir = build_tiny_model(folder, vocab_size=128)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = TorchEngine(model, tokenizer, eos_token_ids=[0], context_length=256)
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    packed, padded = (LoraTrainer(engine, name, lora, seed=seed) for name in ("packed", "padded"))
    assert packed.packs_prefixes and padded.packs_prefixes
    padded.packs_prefixes = False
    return packed, padded
