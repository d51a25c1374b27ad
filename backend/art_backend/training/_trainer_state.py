"""A trainer's files in a checkpoint folder: the adapter weights and the optimizer and RNG state,
read back without running any pickled code."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import TrainerStateError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
TRAINER_STATE = "trainer_state.pt"


def read_trainer_state(path: Path) -> dict[str, Any]:
    """The optimizer and RNG state of `path`, loaded without running any pickled code.

    A state written before the constant learning-rate scheduler went (it never changed a rate:
    each step sets its own) also holds a "scheduler" entry; it is read and ignored."""
    try:
        # weights_only: tensors, numbers and plain containers; any other object is refused
        # before it is built, so a planted pickle never runs.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message advises `weights_only=False`, the very hole closed here: keep only
        # the line that says what was refused (e.g. "unsupported GLOBAL posix.system").
        lines = [line for line in str(error).splitlines() if line.strip()]
        refused = [line for line in lines if "weights_only" not in line.lower()]
        reason = pickle.UnpicklingError(" ".join(refused) or "a non-tensor object")
        raise TrainerStateError(state_message(path, reason)) from None
    except Exception as error:  # a torn zip, a truncated file: the file is unusable
        raise TrainerStateError(state_message(path, error)) from error
    shape_ok = (
        isinstance(state, dict)
        and isinstance(state.get("optimizer"), dict)
        and isinstance(state.get("scheduler", {}), dict)
        and isinstance(state.get("optimizer_steps"), int)
        and isinstance(state.get("rng"), dict)
        and isinstance(state["rng"].get("torch"), torch.Tensor)
        and isinstance(state["rng"].get("python"), tuple)
    )
    if not shape_ok:
        raise TrainerStateError(state_message(path, ValueError("unexpected contents")))
    return state


def short_error(error: Exception, limit: int = 300) -> str:
    """`Type: message` on one line, cut to `limit` characters."""
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def state_message(path: Path, error: Exception) -> str:
    return (
        f"The trainer state {path} cannot be used ({short_error(error)}): it holds something other than plain tensors and numbers (written by another "
        "program, or tampered with), or is damaged. The adapter weights beside it are fine: "
        "delete the file to resume from them with a fresh optimizer."
    )
