"""The langgraph tests use the training backend of the core tests (a server on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

import art_core as art
from tests.support.models import fresh_model


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)
