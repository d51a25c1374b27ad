"""Our side of the training benchmarks: the model every benchmark trains, set up one way."""

from __future__ import annotations

import os

import art_core as art


def qkvo_model(name: str) -> art.TrainableModel:
    """SmolLM2-135M-Instruct with LoRA r16/alpha 32 on q, k, v, o (the peers' adapter too)."""
    return art.TrainableModel(
        name=name,
        project="bench",
        base_model="smollm2-135m-instruct",
        lora=art.LoRAConfig(
            r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
    )


def engine_args(engine: str) -> list[str]:
    """art-server arguments for `engine`; vLLM comes from ART_VLLM_PYTHON (make vllm-env)."""
    if engine == "vllm" and not os.environ.get("ART_VLLM_PYTHON"):
        raise SystemExit(
            "--engines vllm needs ART_VLLM_PYTHON: .venv-vllm/bin/python (make vllm-env)"
        )
    return ["--engine", engine]
