"""LoRA adapters with random weights, saved as PEFT folders (what a trainer would write)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def load_model(folder: Path):
    """The model in `folder`, float32, in eval mode."""
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def make_random_adapter(base_dir: Path, folder: Path, seed: int) -> Path:
    """A LoRA (r=4, q/v) with random, non-zero weights for the model in `base_dir`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(load_model(base_dir), config).save_pretrained(folder)
    return folder


def tar_of(files: dict[str, bytes]) -> bytes:
    """A tar archive of `files` (name -> bytes), names taken as they are (`../x` included)."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
