"""The model the CPU examples train: SmolLM2-135M-Instruct, the embedded default, with LoRA
r16/alpha 32 on the attention projections (q, k, v, o)."""

from __future__ import annotations

import art_core as art


def smollm2_trainable(name: str, project: str) -> art.TrainableModel:
    return art.TrainableModel(
        name=name,
        project=project,
        base_model="smollm2-135m-instruct",
        lora=art.LoRAConfig(
            r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
    )
