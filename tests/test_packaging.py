"""The distribution: light client install, four import names on folders that bear them."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HEAVY = ("torch", "transformers", "peft", "accelerate", "vllm", "unsloth", "trl")


def test_client_install_pulls_no_torch():
    base = " ".join(PYPROJECT["project"]["dependencies"]).lower()
    assert not [name for name in HEAVY if name in base]


def test_gpu_engines_live_only_in_their_own_extras():
    """vLLM and Unsloth pin their own transformers: never pulled in by another extra."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["vllm"] == ["vllm>=0.32,<0.33"] and extras["unsloth"][0].startswith("unsloth")
    for extra, requirements in extras.items():
        if extra not in ("vllm", "unsloth"):
            assert not any(r.startswith(("vllm", "unsloth")) for r in requirements), extra


@pytest.mark.parametrize(
    ("import_name", "folder"),
    [
        ("art_core", "art_core"),
        ("art_backend", "backend/art_backend"),
        ("art_langgraph", "integrations/langgraph/art_langgraph"),
        ("art_mcp", "integrations/mcp/art_mcp"),
        ("art_ray", "integrations/ray/art_ray"),
    ],
)
def test_import_names_map_to_folders(import_name, folder):
    module = importlib.import_module(import_name)
    assert Path(module.__file__).resolve().parent == ROOT / folder


def test_art_core_imports_without_torch():
    code = "import sys, art_core; assert 'torch' not in sys.modules, 'art_core imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
