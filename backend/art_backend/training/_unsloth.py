"""Unsloth as the GPU trainer option: load the trainer's base model through Unsloth's kernels.

`art-server --trainer unsloth` loads the model the trainer trains with
`unsloth.FastLanguageModel.from_pretrained` (16-bit, no quantization) instead of
`transformers.AutoModelForCausalLM`; everything after the load is unchanged. Unsloth is an
extra (`pip install 'art-trainer[unsloth]'`) and runs on CUDA only, so:

- nothing here imports `unsloth` at module import: `import unsloth` raises without a GPU and,
  where it succeeds, patches transformers and PEFT for the whole process;
- `check_unsloth_available` says what to do before anything is loaded, as a named error.

Same checkpoint format. The adapter is added by our trainer through plain PEFT
(`TrainableEngine.add_trainable_adapter` -> `peft.get_peft_model` / `add_adapter`), not through
`FastLanguageModel.get_peft_model`, and saved by `LoraTrainer.save` as before: an
`adapter_config.json` plus `adapter_model.safetensors` that any PEFT loader, our server or vLLM
reads. Unsloth's attention calls `self.q_proj(x)`... on the modules, so PEFT's LoRA layers run
inside Unsloth's patched forwards (its RMSNorm, RoPE, SwiGLU and attention kernels); what is
given up is Unsloth's fused LoRA kernels, which `get_peft_model` installs for one adapter only.

Unsloth replaces `forward` on the model classes (`LlamaForCausalLM`, `Qwen2ForCausalLM`,
`PeftModelForCausalLM`, ...) for the whole process, and its forward turns a transformers
`DynamicCache` into a new tuple instead of filling it in place, which our torch engine's decode
loop relies on: serve from another process (the vLLM engine). Read in Unsloth 2026.10.9's
source; none of this module has run on a GPU yet (tests/server/training/test_unsloth.py does,
where there is one).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import ModelLoadError, UnslothUnavailableError

UNSLOTH_PACKAGE = "unsloth"
INSTALL_HINT = "pip install 'art-trainer[unsloth]' on a CUDA machine"


def check_unsloth_available() -> None:
    """Raise UnslothUnavailableError unless there is a CUDA device and the unsloth package.

    Checks without importing unsloth (find_spec), so it is safe to call on any machine.
    """
    if not torch.cuda.is_available():
        raise UnslothUnavailableError(
            "Unsloth trains on CUDA GPUs only; this machine has no CUDA device: leave --trainer "
            f"at its default (torch). (torch {torch.__version__} sees no CUDA device.)"
        )
    if importlib.util.find_spec(UNSLOTH_PACKAGE) is None:
        raise UnslothUnavailableError(
            f"--trainer unsloth needs the unsloth package, which is not installed: {INSTALL_HINT} "
            "(or leave --trainer at its default, torch)."
        )


def load_unsloth_model(
    source: Path | str, *, dtype: torch.dtype, max_seq_length: int
) -> tuple[Any, Any]:
    """(model, tokenizer) of `source` (a folder or hub id) loaded by Unsloth on the current GPU.

    The same shape as the torch loader's: a transformers causal LM in eval mode, not yet wrapped
    by PEFT, and its tokenizer. `max_seq_length` must cover the longest training row: Unsloth's
    forward cuts anything longer. Raises UnslothUnavailableError where Unsloth cannot run and
    ModelLoadError (with Unsloth's reason) where it runs but cannot load this model.
    """
    check_unsloth_available()
    # Unsloth downloads a file from the hub at load time to count its users unless told not to.
    os.environ.setdefault("UNSLOTH_DISABLE_STATISTICS", "1")
    from unsloth import FastLanguageModel  # an optional extra

    try:
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=str(source),
            max_seq_length=max_seq_length,
            dtype=dtype,
            load_in_4bit=False,  # Unsloth's default is 4-bit QLoRA; ours train on 16-bit bases
            load_in_8bit=False,
            full_finetuning=False,
            # One GPU, the one torch uses: the trainer moves every batch to a single `device`.
            device_map={"": torch.cuda.current_device()},
            # Keep the tokenizer as saved: its ids must match the ones the server recorded.
            fix_tokenizer=False,
            # The trainer turns gradient checkpointing on and off per step (OptimizerSettings).
            use_gradient_checkpointing=False,
        )
    except (OSError, ValueError, RuntimeError, ImportError, NotImplementedError) as error:
        raise ModelLoadError(
            f"Unsloth could not load {str(source)!r} ({type(error).__name__}: {error}). "
            "Leave --trainer at its default (torch) to train it with transformers."
        ) from error
    model.eval()
    return model, tokenizer
