"""Shared fixtures: the tiny random chat model every backend test runs on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a tiny random Llama model and a ChatML tokenizer, built once per session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
