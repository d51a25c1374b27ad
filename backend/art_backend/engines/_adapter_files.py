"""What a LoRA adapter folder must hold before PEFT reads it, checked against the base model.

PEFT fails on a bad folder with a KeyError, a size mismatch, or after it has already wrapped the
model's layers (then the model stays changed). So every folder the server loads is checked here
first, torch-cheaply: adapter_config.json (a plain LoRA, not DoRA; a rank, target modules that
name modules of this model), the safetensors weights' header (tensors inside the file: not
truncated, not garbage), the LoRA shapes against the model's linear layers (not another model's
adapter) and their ranks against the config's `r` (a config that says r=4 for rank-16 weights).
Each refusal is an InvalidRequestError on `path` that says what is wrong. A folder a client names
(POST /v1/adapters) is first confined to the server's --path (`confined_adapter_folder`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import InvalidNameError, InvalidRequestError

ADAPTER_CONFIG = "adapter_config.json"
# The only weights file read (what `_trainer` writes): PEFT would fall back to a pickled
# `adapter_model.bin`, and nothing the server loads may be unpickled.
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
# Module types PEFT's LoRA can wrap; the names of these are what `target_modules` may name.
_ADAPTABLE_TYPES: tuple[type, ...] = (
    torch.nn.Linear,
    torch.nn.Embedding,
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
)


def adaptable_modules(model: Any) -> list[str]:
    """Full names of the modules of `model` a LoRA can wrap, LoRA's own layers left out."""
    from transformers.pytorch_utils import Conv1D

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = []
    for name, module in base.named_modules():
        # Once PEFT wrapped a layer, the original sits at `<name>.base_layer` beside `lora_A`...
        if not isinstance(module, (*_ADAPTABLE_TYPES, Conv1D)):
            continue
        if any(part.startswith("lora_") for part in name.split(".")):
            continue
        names.append(name.removesuffix(".base_layer"))
    return names


def unmatched_target_modules(module_names: list[str], targets: list[str]) -> list[str]:
    """The `target_modules` entries that match no module, by PEFT's rule for a list of names."""
    return [
        target
        for target in targets
        if not any(name == target or name.endswith(f".{target}") for name in module_names)
    ]


def linear_shapes(model: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each linear module of `model`, by its full name."""
    from transformers.pytorch_utils import Conv1D

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    shapes = {}
    for name, module in base.named_modules():
        if any(part.startswith("lora_") for part in name.split(".")):
            continue
        if isinstance(module, torch.nn.Linear):
            shapes[name.removesuffix(".base_layer")] = (module.in_features, module.out_features)
        elif isinstance(module, Conv1D):  # GPT-2's linear layers: weight [in, out]
            shapes[name.removesuffix(".base_layer")] = (module.nx, module.nf)
    return shapes


# A safetensors header is a few kilobytes for an adapter; past this it is not one.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
PEFT_PREFIX = "base_model.model."


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The tensors a safetensors file declares (`dtype`, `shape`, `data_offsets`), checked to lie
    inside the file. Raises ValueError saying what is wrong (truncated, not safetensors)."""
    size = path.stat().st_size
    with open(path, "rb") as weights:
        length_bytes = weights.read(8)
        if len(length_bytes) < 8:
            raise ValueError(f"it has {size} bytes, fewer than a safetensors header")
        length = int.from_bytes(length_bytes, "little")
        if length > min(size - 8, MAX_SAFETENSORS_HEADER):
            raise ValueError("its header claims more bytes than the file holds (truncated?)")
        try:
            header = json.loads(weights.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"its header is not safetensors JSON ({error})") from error
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    data_bytes = size - 8 - length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        shape = info.get("shape") if isinstance(info, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
            and isinstance(shape, list)
            and all(isinstance(d, int) for d in shape)
        ):
            raise ValueError(f"tensor {name!r} has no valid shape and data offsets")
        if not 0 <= offsets[0] <= offsets[1] <= data_bytes:
            raise ValueError(
                f"tensor {name!r} lies past the end of the file (bytes {offsets[0]}-{offsets[1]} "
                f"of {data_bytes}): the file is truncated"
            )
        tensors[name] = info
    return tensors


def _weights_problem(tensors: dict[str, Any], shapes: dict[str, tuple[int, int]]) -> str | None:
    """Why LoRA A/B weights do not fit the model's linear layers (another base model), if so."""
    ranks: dict[str, dict[str, int]] = {}
    for name, info in tensors.items():
        for part, dimension in (("lora_A", 1), ("lora_B", 0)):
            suffix = f".{part}.weight"
            if not name.endswith(suffix):
                continue
            module = name.removeprefix(PEFT_PREFIX).removesuffix(suffix)
            if module not in shapes or len(info["shape"]) != 2:
                continue
            expected = shapes[module][0 if part == "lora_A" else 1]
            if info["shape"][dimension] != expected:
                side = "in" if part == "lora_A" else "out"
                return (
                    f"{name} has shape {info['shape']}, but the base model's {module} has "
                    f"{side}_features={expected} (was it trained on another base model?)."
                )
            ranks.setdefault(module, {})[part] = info["shape"][1 - dimension]
    for module, rank in ranks.items():
        if len(rank) == 2 and rank["lora_A"] != rank["lora_B"]:
            return f"{module}'s lora_A and lora_B disagree on the rank ({rank})."
    return None


def _rank_problem(tensors: dict[str, Any], config: dict[str, Any], rank: int) -> str | None:
    """Why the LoRA weights' ranks disagree with adapter_config.json's `r` (or its
    `rank_pattern`, PEFT's per-module ranks), if they do: PEFT builds layers of the config's rank,
    then fails copying weights of another ("size mismatch"), or worse, after wrapping layers."""
    patterns = config.get("rank_pattern") or {}
    if not (
        isinstance(patterns, dict)
        and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in patterns.values()
        )
    ):
        return (
            f'{ADAPTER_CONFIG} has "rank_pattern" {json.dumps(patterns)[:200]}: it must map '
            "module names to positive integers."
        )
    for name, info in tensors.items():
        for part, dimension in (("lora_A", 0), ("lora_B", 1)):
            suffix = f".{part}.weight"
            if not name.endswith(suffix) or len(info["shape"]) != 2:
                continue
            module = name.removeprefix(PEFT_PREFIX).removesuffix(suffix)
            expected, said = rank, f'"r": {rank}'
            for pattern, value in patterns.items():  # PEFT's rule: the module's name ends so
                if re.fullmatch(rf"(.*\.)?(?:{pattern})", module):
                    expected, said = value, f'"rank_pattern" {{{json.dumps(pattern)}: {value}}}'
                    break
            if info["shape"][dimension] != expected:
                return (
                    f"{name} has rank {info['shape'][dimension]} (shape {info['shape']}), but "
                    f"{ADAPTER_CONFIG} says {said}. Write the rank the adapter was trained with "
                    f"into {ADAPTER_CONFIG}."
                )
    return None


def check_adapter_folder(
    folder: Path, module_names: list[str], shapes: dict[str, tuple[int, int]] | None = None
) -> dict[str, Any]:
    """The adapter_config.json of a LoRA folder, and its weights' header, checked before PEFT
    reads them; with `shapes` (see `linear_shapes`), the weights must fit those layers.

    Raises InvalidRequestError (param "path") saying what is wrong: PEFT itself fails on a bad
    config with a KeyError, or after it has already wrapped the model's layers.
    """

    def refuse(problem: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"Cannot load the adapter at {str(folder)!r}: {problem}", param="path"
        )

    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise refuse(f"{ADAPTER_CONFIG} cannot be read ({error}).") from error
    except json.JSONDecodeError as error:
        raise refuse(f"{ADAPTER_CONFIG} is not JSON ({error}).") from error
    if not isinstance(config, dict):
        raise refuse(f"{ADAPTER_CONFIG} must hold a JSON object.")
    if config.get("peft_type") != "LORA":
        raise refuse(
            f'{ADAPTER_CONFIG} has "peft_type": {json.dumps(config.get("peft_type"))}; '
            'this server loads LoRA adapters only ("peft_type": "LORA").'
        )
    if config.get("use_dora") not in (None, False):
        # PEFT would build DoRA layers (a magnitude per output, taken from the base weights when
        # the file has none) that no engine here batches and no trainer here trains.
        raise refuse(
            f'{ADAPTER_CONFIG} has "use_dora": {json.dumps(config["use_dora"])}; this server '
            "serves and trains plain LoRA only. Merge a DoRA adapter into the base model and "
            'serve that; for an adapter trained without DoRA, set "use_dora": false.'
        )
    rank = config.get("r", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise refuse(f'"r" must be a positive integer, got {json.dumps(rank)}.')
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise refuse(f'"lora_alpha" must be a number, got {json.dumps(alpha)}.')
    targets = config.get("target_modules")
    if isinstance(targets, list) and all(isinstance(target, str) for target in targets):
        if unmatched := unmatched_target_modules(module_names, targets):
            raise refuse(
                f'"target_modules" names {unmatched}, which match no module of the base model '
                "(was it trained on another base model?)."
            )
    elif isinstance(targets, str) and targets != "all-linear":  # PEFT: a regex, full match
        try:
            pattern = re.compile(targets)
        except re.error as error:
            raise refuse(f'"target_modules" is not a regular expression ({error}).') from error
        if not any(pattern.fullmatch(name) for name in module_names):
            raise refuse(f'"target_modules" {targets!r} matches no module of the base model.')
    elif targets is not None and not isinstance(targets, str):
        raise refuse('"target_modules" must be a list of module names.')
    if not (folder / ADAPTER_SAFETENSORS).is_file():
        raise refuse(f"{ADAPTER_SAFETENSORS} is missing (only safetensors weights are loaded).")
    try:
        tensors = read_safetensors_header(folder / ADAPTER_SAFETENSORS)
    except (OSError, ValueError) as error:
        raise refuse(f"{ADAPTER_SAFETENSORS} cannot be used: {error}.") from error
    if shapes is not None and (problem := _weights_problem(tensors, shapes)):
        raise refuse(f"{ADAPTER_SAFETENSORS} does not fit this model: {problem}")
    try:
        problem = _rank_problem(tensors, config, rank)
    except re.error as error:
        problem = (
            f'{ADAPTER_CONFIG} has a "rank_pattern" key that is no regular expression ({error}).'
        )
    if problem:
        raise refuse(f"{ADAPTER_SAFETENSORS} does not match its config: {problem}")
    return config


def confined_adapter_folder(requested: str, root: Path) -> Path:
    """The adapter folder a client named (`requested`), resolved, once it is inside `root` (the
    server's --path) and holds an adapter_config.json, its files no links out of `root`.

    Raises InvalidNameError (outside `root`) or InvalidRequestError (not a usable path, no
    adapter there), both on param "path"; the folder's contents are `check_adapter_folder`'s.
    """
    root = root.resolve()
    try:
        # A NUL byte or an over-long name raises here rather than naming a missing folder.
        path = Path(requested).resolve()
        found = path.is_relative_to(root) and (path / ADAPTER_CONFIG).is_file()
    except (ValueError, OSError) as error:
        raise InvalidRequestError(
            f"Adapter path {requested!r} is not a usable path: {error}.", param="path"
        ) from error
    if not path.is_relative_to(root):
        raise InvalidNameError(
            f"Adapter path {requested!r} is outside the server's --path {str(root)!r}.",
            param="path",
        )
    if not found:
        raise InvalidRequestError(
            f"No PEFT adapter at {requested!r} (adapter_config.json missing).", param="path"
        )
    # The folder is inside --path; the files PEFT reads must be too (not links out of it).
    for name in (ADAPTER_CONFIG, ADAPTER_SAFETENSORS):
        if not (path / name).resolve().is_relative_to(root):
            raise InvalidNameError(
                f"Adapter file {name} in {requested!r} links outside the server's --path "
                f"{str(root)!r}; copy the file into the folder instead.",
                param="path",
            )
    return path
