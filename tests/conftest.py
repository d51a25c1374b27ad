"""Shared fixtures: the tiny random chat model every backend test runs on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a tiny random Llama model and a ChatML tokenizer, built once per session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session", autouse=True)
def _judge_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Judge and generator answers cached by default go to a temporary folder, not ~/.cache."""
    previous = os.environ.get("ART_CACHE_DIR")
    os.environ["ART_CACHE_DIR"] = str(tmp_path_factory.mktemp("art-cache"))
    yield
    if previous is None:
        os.environ.pop("ART_CACHE_DIR", None)
    else:
        os.environ["ART_CACHE_DIR"] = previous
