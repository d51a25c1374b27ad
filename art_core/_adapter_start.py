"""A model that starts from a LoRA adapter: ART's `base_model="/path/to/my_sft_lora_adapter"`.

ART's client page warm-starts RL from an SFT LoRA by naming the adapter's folder as the base
model (a PEFT folder: `adapter_config.json` and the weights). Here registering such a model
serves the adapter's own base model (`base_model_name_or_path` in its config) and makes the
adapter the model's step 0: its LoRA settings (rank, alpha, target modules) are the adapter's,
and training goes on from its weights. What cannot start that way is refused by name: a folder
without a base model in its config, weights only in pickle form (`adapter_model.bin`: convert
them to safetensors), target modules given as a pattern, or LoRA settings given to the model
that differ from the adapter's.

Both sides read the folder with `read_adapter_start`: the client to learn the base model to
serve and the LoRA settings to register, the server to check the folder again before copying
it in (the folder must be readable where the server runs: a LocalBackend's, or a server on
the same machine).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_core.errors import UnsupportedOptionError

__all__ = ["ADAPTER_FILES", "AdapterStart", "read_adapter_start"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)


@dataclass(frozen=True)
class AdapterStart:
    """An adapter folder to start from: where, on which base model, with which LoRA."""

    folder: str
    base_model: str
    lora: dict[str, Any]


def is_adapter_folder(name: str) -> bool:
    """A folder holding a PEFT adapter and no model of its own."""
    path = Path(name).expanduser()
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def read_adapter_start(name: str) -> AdapterStart | None:
    """The adapter folder `name` names, read and checked; None when `name` is not one."""
    if not is_adapter_folder(name):
        return None
    path = Path(name).expanduser().resolve()
    where = f"the LoRA adapter folder {str(path)!r}"
    for file in ADAPTER_FILES:
        if (path / file).is_symlink():
            raise UnsupportedOptionError(f"{where}: {file} is a symbolic link; copy the file in.")
    if not (path / ADAPTER_WEIGHTS).is_file():
        pickled = (
            " (adapter_model.bin is pickle: save it as safetensors)"
            if (path / "adapter_model.bin").is_file()
            else ""
        )
        raise UnsupportedOptionError(f"{where} has no {ADAPTER_WEIGHTS}{pickled}.")
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UnsupportedOptionError(f"{where}: {ADAPTER_CONFIG} is not JSON ({error}).") from error
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise UnsupportedOptionError(
            f"{where}: its {ADAPTER_CONFIG} names no base_model_name_or_path, so which model "
            "it adapts is unknown; add it (the base model's folder or hub id)."
        )
    modules = config.get("target_modules")
    if not isinstance(modules, list) or not modules:
        raise UnsupportedOptionError(
            f"{where}: target_modules {modules!r} is not a list of module names (a pattern "
            "cannot be checked against the model here); list the modules."
        )
    lora = {
        "r": int(config.get("r", 8)),
        "alpha": float(config.get("lora_alpha", 8)),
        "dropout": float(config.get("lora_dropout", 0.0)),
        "target_modules": sorted(str(module) for module in modules),
    }
    return AdapterStart(str(path), base, lora)


def lora_for_adapter(start: AdapterStart, given: Any, default: Any) -> dict[str, Any]:
    """The LoRA settings to register: the adapter's; LoRA settings given to the model that
    differ from them are refused (the adapter's weights have its shapes)."""
    if given is not None and given != default:
        theirs = given.model_dump() if hasattr(given, "model_dump") else dict(given)
        mismatched = lora_differences(theirs, start)
        if mismatched:
            raise UnsupportedOptionError(
                f"The model's LoRA settings differ from those of the adapter it starts from "
                f"({start.folder}): {mismatched} (given, adapter's). Leave lora= unset to use "
                "the adapter's."
            )
    return dict(start.lora)


def lora_differences(given: Mapping[str, Any], start: AdapterStart) -> dict[str, Any]:
    """The LoRA settings in `given` that differ from the adapter's: key -> (given, adapter's)
    (target modules compared as sets)."""
    return {
        key: (given[key], value)
        for key, value in start.lora.items()
        if key in given
        and (sorted(given[key] or []) if isinstance(value, list) else given[key]) != value
    }
