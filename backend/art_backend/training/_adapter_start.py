"""A new model's step 0 from a PEFT adapter folder (`RegisterRequest.init_adapter`).

ART warm-starts RL from an SFT LoRA by naming the adapter's folder as the base model; the
client (`art_core._adapter_start`) registers the adapter's base model and LoRA settings and
names the folder. Here the folder is checked again where it is read (its files plain, its
settings the registered ones) and its two files are copied in as checkpoint 0, which the
trainer then loads like any checkpoint (a base model it does not fit: the load's own error).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from art_backend._errors import InvalidRequestError
from art_core._adapter_start import ADAPTER_FILES, lora_differences, read_adapter_start
from art_core.errors import UnsupportedOptionError
from art_core.wire import RegisterRequest

__all__ = ["adapter_source", "copy_adapter"]


def adapter_source(request: RegisterRequest) -> Path:
    """The adapter folder `init_adapter` names, checked; every refusal a 400 on it."""
    assert request.init_adapter is not None
    try:
        start = read_adapter_start(request.init_adapter)
    except UnsupportedOptionError as error:
        raise InvalidRequestError(str(error), param="init_adapter") from error
    if start is None:
        raise InvalidRequestError(
            f"init_adapter {request.init_adapter!r} is not a LoRA adapter folder on the "
            "server's machine (adapter_config.json and adapter_model.safetensors, no "
            "config.json).",
            param="init_adapter",
        )
    differing = lora_differences(request.lora.model_dump(), start)
    if differing:
        raise InvalidRequestError(
            f"init_adapter {start.folder}: the registered LoRA settings differ from the "
            f"adapter's {differing} (registered, adapter's).",
            param="lora",
        )
    return Path(start.folder)


def copy_adapter(folder: Path) -> Callable[[Path], None]:
    """Fill a checkpoint folder with the adapter's config and weights."""

    def copy(tmp: Path) -> None:
        for name in ADAPTER_FILES:
            shutil.copyfile(folder / name, tmp / name)

    return copy
