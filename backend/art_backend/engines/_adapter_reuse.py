"""A served adapter's layers used again: a new adapter of the same shape is copied into the
layers of one just unloaded, instead of PEFT building new ones.

Each training step serves a new adapter (`agent@N`) and unloads the step that leaves the
served window. PEFT's `load_adapter` builds every LoRA layer anew (it walks the model, creates
two `nn.Linear` a layer, casts them, marks what trains): 0.14 s of each GRPO step on SmolLM2
with an adapter on 120 layers, in the step's critical path (py-spy on `art-server`, 2 threads
of a Xeon, 2026-12-06). So the engine keeps an unloaded adapter as a retired slot (`RETIRED`
of them; no served name reaches it any more), and an adapter whose config builds the same
layers (`SAME_LAYERS`) and whose weights name exactly the slot's tensors, with their shapes and
dtypes, is copied into them: the values PEFT would have loaded, in the tensors it would have
loaded them into. Anything else (another rank or scale, other modules, another dtype) goes
through PEFT as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from art_backend.engines._adapter_files import ADAPTER_CONFIG, ADAPTER_SAFETENSORS

RETIRED = 1  # unloaded adapters kept for the next load: one per step is what a run unloads
# The adapter_config.json fields that decide a LoRA's layers and their scale.
SAME_LAYERS = (
    "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "target_modules",
    "exclude_modules", "layers_to_transform", "layers_pattern", "modules_to_save", "bias",
    "lora_bias", "use_dora", "fan_in_fan_out", "lora_dropout",
)  # fmt: skip


def load_into(model: Any, adapter_name: str, folder: Path) -> bool:
    """Copy the adapter in `folder` (checked by `check_adapter_folder`) into the layers of the
    PEFT adapter `adapter_name` if they are its layers; False, with nothing changed, if not."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    slot = model.peft_config[adapter_name].to_dict()
    if any(_normal(config.get(key)) != _normal(slot.get(key)) for key in SAME_LAYERS):
        return False
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    # The slot's tensors (views of its parameters) by the names PEFT saves them under.
    tensors = get_peft_model_state_dict(model, adapter_name=adapter_name)
    weights = load_file(folder / ADAPTER_SAFETENSORS)
    if weights.keys() != tensors.keys():
        return False
    for key, weight in weights.items():
        if weight.shape != tensors[key].shape or weight.dtype != tensors[key].dtype:
            return False
    with torch.no_grad():
        for key, weight in weights.items():
            tensors[key].copy_(weight)
    return True


def _normal(value: Any) -> Any:
    """A config value as JSON keeps it: sets and tuples as sorted lists."""
    if isinstance(value, (set, tuple, list)):
        return sorted(str(item) for item in value)
    return value
