"""The langgraph tests use the training backend of the core tests (a server on 127.0.0.1)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import art_core as art
from tests.core.conftest import remote_backend, training_server

__all__ = ["remote_backend", "training_server"]


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    trainable = art.TrainableModel(
        name=f"lg-{uuid.uuid4().hex[:8]}", project="tests", base_model=str(tiny_model_dir)
    )
    await trainable.register(remote_backend)
    return trainable
