"""`art-server --vllm-*`: the options that start (or attach to) vLLM, and the engines they build.

`vllm_engine` builds one `VllmEngine` over a vLLM server we start as a child or one already
running at `--vllm-url`; `vllm_replicas` one per URL. Nothing here imports vLLM or torch at
module level.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_backend._errors import InvalidRequestError
from art_backend.engines._engine_choice import openmp_settings_made_here


@dataclass
class VllmOptions:
    """`art-server --vllm-*`: how the vLLM engine's server is started (see _vllm_process)."""

    python: str | None = None  # else $ART_VLLM_PYTHON, else this interpreter if it has vLLM
    url: str | None = None  # a vLLM server already running: used, not started
    replica_urls: list[str] = field(default_factory=list)  # more of them: one replica each
    max_lora_rank: int = 16
    kv_cache_gb: int = 2  # CPU only
    sleep: bool | None = None  # None: sleep during steps when vLLM shares the trainer's GPU
    devices: str | None = None  # CUDA_VISIBLE_DEVICES of vLLM: a GPU of its own
    args: list[str] = field(default_factory=list)  # passed to vLLM as they are


def vllm_replicas(
    options: VllmOptions, python: str, loaded: Any, trainer_host: Any, art_path: Path
) -> list[Any]:
    """One vLLM engine per `--vllm-url` (or the one we start), in their order."""
    urls = [options.url, *options.replica_urls] if options.url else [None]
    return [
        vllm_engine(dataclasses.replace(options, url=url), python, loaded, trainer_host, art_path)
        for url in urls
    ]


def vllm_engine(
    options: VllmOptions, python: str, loaded: Any, trainer_host: Any, art_path: Path
) -> Any:
    """The vLLM engine for `loaded` (started as our child, or attached to `options.url`); the
    torch engine `trainer_host` keeps the trainer's copy of the weights."""
    from art_backend.engines._vllm_engine import VllmEngine
    from art_backend.engines._vllm_process import (
        AttachedVllm,
        VllmProcess,
        VllmServer,
        VllmSettings,
    )

    on_cuda = loaded.device.type == "cuda"
    if options.sleep and not on_cuda:
        raise InvalidRequestError("--vllm-sleep needs CUDA: vLLM's sleep mode is GPU-only.")
    sleep = options.sleep if options.sleep is not None else on_cuda and options.devices is None
    extra = list(options.args)
    if on_cuda and options.devices is None and "--gpu-memory-utilization" not in " ".join(extra):
        extra += ["--gpu-memory-utilization", "0.6"]  # the trainer's copy shares this GPU
    settings = VllmSettings(
        python=python,
        model=str(loaded.source),
        dtype=str(loaded.dtype).removeprefix("torch."),
        context_length=loaded.context_length,
        max_lora_rank=options.max_lora_rank,
        kv_cache_gb=options.kv_cache_gb,
        sleep_mode=sleep,
        devices=options.devices,
        extra_args=extra,
        log_path=art_path / "logs" / "vllm.log",
        unset_env=openmp_settings_made_here(),
    )
    server: VllmServer = AttachedVllm(options.url) if options.url else VllmProcess(settings)
    return VllmEngine(
        server,
        loaded.tokenizer,
        eos_token_ids=loaded.eos_token_ids,
        context_length=loaded.context_length,
        vocab_size=int(loaded.model.config.vocab_size),
        adaptable_modules=trainer_host.adaptable_modules,
        max_lora_rank=options.max_lora_rank,
    )
