"""ART's `art.utils.output_dirs`: where a model's files are under a backend's folder.

The layout is the backend's (`.art/<project>/models/<name>/checkpoints/<step:04d>/`, and
`trajectories/<split>/<step:04d>.jsonl.gz`), the same as ART's. The default folder is the one
`art.LocalBackend()` uses: `.art` in the current directory (ART looks for the git root first).
"""

from __future__ import annotations

import os
from typing import Protocol

__all__ = [
    "get_default_art_path",
    "get_model_dir",
    "get_models_dir",
    "get_output_dir_from_model_properties",
    "get_step_checkpoint_dir",
    "get_trajectories_dir",
    "get_trajectories_split_dir",
]


class _NamedModel(Protocol):
    name: str
    project: str


def get_default_art_path() -> str:
    """The folder `art.LocalBackend()` writes to by default (absolute)."""
    return os.path.abspath(".art")


def get_models_dir(project_name: str, art_path: str | None = None) -> str:
    """The folder holding a project's models."""
    return f"{art_path or get_default_art_path()}/{project_name}/models"


def get_model_dir(model: _NamedModel, art_path: str | None = None) -> str:
    """The folder of one model (its checkpoints, history and trajectories)."""
    return get_output_dir_from_model_properties(model.project, model.name, art_path)


def get_output_dir_from_model_properties(
    project: str, name: str, art_path: str | None = None
) -> str:
    """The folder of the model `name` in `project`."""
    return f"{get_models_dir(project, art_path)}/{name}"


def get_step_checkpoint_dir(model_output_dir: str, step: int) -> str:
    """The checkpoint folder of `step` (complete once it exists: it is renamed into place)."""
    return f"{model_output_dir}/checkpoints/{step:04d}"


def get_trajectories_dir(model_output_dir: str) -> str:
    """The folder of the model's logged trajectories."""
    return f"{model_output_dir}/trajectories"


def get_trajectories_split_dir(model_output_dir: str, split: str) -> str:
    """The folder of one split's trajectories (`train`, `val`, ...), one file per step."""
    return f"{model_output_dir}/trajectories/{split}"
