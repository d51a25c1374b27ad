"""Models for the client tests."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import art_core as art


async def fresh_model(
    backend: art.Backend, tiny_model_dir: Path, **options: Any
) -> art.TrainableModel:
    """A newly registered model with a unique name, on the tiny base model."""
    trainable = art.TrainableModel(
        name=f"m-{uuid.uuid4().hex[:8]}",
        project="tests",
        base_model=str(tiny_model_dir),
        **options,
    )
    await trainable.register(backend)
    return trainable
