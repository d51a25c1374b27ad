"""Which engine serves (`--engine`), and what that choice must set before torch is imported.

`pick_engine` follows the rule measured in BENCHMARKS.md (vLLM on CUDA, the torch engine on a
CPU); `wait_passively_beside_vllm` sets OpenMP's waits for a trainer beside vLLM's CPU build.
Nothing here imports torch or vLLM at module level: the command calls these before it loads
anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from art_backend._errors import ModelLoadError

ENGINE_CHOICES = ("auto", "torch", "vllm")

_OPENMP_SET_HERE: set[str] = set()  # not passed on to vLLM, which sets its own


def pick_engine(requested: str, device: str, vllm_python: str | None) -> tuple[str, str]:
    """The engine `--engine` names, and why; `auto` follows the rule measured in BENCHMARKS.md.

    On CUDA, vLLM whenever it is installed (paged attention, CUDA graphs, prefix caching). On
    CPU, the torch engine: measured on 2 cores with SmolLM2-135M, it is 2.1x vLLM's CPU build on
    adapter traffic (what RL serves; 131 vs 64 tok/s), starts in 6 s instead of 40 and holds
    1.2 GB instead of 5.4; vLLM is 1.2x ahead on base-model traffic (--engine vllm for that).
    """
    if requested == "torch":
        return "torch", "--engine torch"
    if requested == "vllm":
        if vllm_python is None:
            from art_backend.engines._vllm_process import INSTALL_HINT

            raise ModelLoadError(f"--engine vllm: vLLM is not installed here; {INSTALL_HINT}.")
        return "vllm", "--engine vllm"
    if device != "cuda":
        return "torch", f"auto: on {device} the torch engine serves adapters faster than vLLM"
    if vllm_python is None:
        return "torch", "auto: CUDA, but vLLM is not installed (pip install 'art-trainer[vllm]')"
    return "vllm", "auto: CUDA and vLLM installed"


def wait_passively_beside_vllm(engine: str, device: str) -> None:
    """With vLLM serving on a CPU, our process only trains: OpenMP waits passively there.

    vLLM's CPU build keeps polling on a core between requests (0.6 cores on average during
    train_step), so the trainer's two threads share the cores with it. Measured, GRPO steps of
    SmolLM2 beside vLLM: spinning threads (libgomp's default) trained at 22.0 s per 1k trained
    tokens, one thread at 28.6, two passive threads at 18.2. The torch engine keeps the spin
    default: there passive waits cost a futex wake per matmul of every decode step
    (BENCHMARKS.md, "Serving under load").
    Must run before torch is imported (libgomp reads it once); a value the user set wins.
    """
    on_cuda = device == "cuda" or (device == "auto" and Path("/proc/driver/nvidia").exists())
    if engine == "vllm" and not on_cuda and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        _OPENMP_SET_HERE.add("OMP_WAIT_POLICY")


def openmp_settings_made_here() -> tuple[str, ...]:
    """The OpenMP variables this process set for itself (a vLLM child must not inherit them)."""
    return tuple(_OPENMP_SET_HERE)
