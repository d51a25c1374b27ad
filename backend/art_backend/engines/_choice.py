"""Which engine serves, with how many threads, and how vLLM is started: `art-server`'s choices.

`pick_engine` follows the rule measured in BENCHMARKS.md (vLLM on CUDA, the torch engine on a
CPU); `replica_count` checks `--replicas` against the `--vllm-url`s, and `torch_replicas` and
`vllm_replicas` build the engines a `ReplicaSet` routes across; `thread_governor` gives the torch
engine the cores other processes leave idle (each replica its share);
`wait_passively_beside_vllm` sets OpenMP's waits before torch is imported. Nothing here imports
torch or vLLM at module level: the command calls these before it loads anything.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_backend._errors import InvalidRequestError, ModelLoadError

if TYPE_CHECKING:
    from art_backend.engines._threads import ThreadGovernor

ENGINE_CHOICES = ("auto", "torch", "vllm")


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


def replica_count(replicas: int, engine: str, vllm: VllmOptions) -> int:
    """How many engine replicas serve: `--replicas` torch engines, or one per `--vllm-url`."""
    urls = 1 + len(vllm.replica_urls) if vllm.url else 0
    if replicas < 1:
        raise InvalidRequestError("--replicas must be at least 1")
    if vllm.replica_urls and engine != "vllm":
        raise InvalidRequestError("Several --vllm-url need --engine vllm (one replica each).")
    if engine == "vllm" and replicas > 1 and replicas != urls:
        raise InvalidRequestError(
            f"--engine vllm --replicas {replicas}: pass one --vllm-url per replica (vLLM servers "
            "you started), or on one multi-GPU node let vLLM balance its own ranks with "
            f"--replicas 1 --vllm-arg=--data-parallel-size={replicas}."
        )
    return max(replicas, urls)


def torch_replicas(first: Any, count: int) -> list[Any]:
    """`first` (the trainer's host) and `count - 1` more torch engines, each on its own copy of
    the weights, taken before any adapter wraps the model."""
    import copy

    from art_backend.engines._torch_engine import TorchEngine

    engines = [first]
    for _ in range(count - 1):
        engines.append(
            TorchEngine(
                copy.deepcopy(first.model),
                first.tokenizer,
                eos_token_ids=sorted(first.eos_token_ids),
                context_length=first.context_length,
                max_batch_size=first.max_batch_size,
                max_batch_tokens=first.max_batch_tokens,
                threads=None if first.threads is None else _share_of(first.threads),
            )
        )
    return engines


def vllm_replicas(
    options: VllmOptions, python: str, loaded: Any, trainer_host: Any, art_path: Path
) -> list[Any]:
    """One vLLM engine per `--vllm-url` (or the one we start), in their order."""
    urls = [options.url, *options.replica_urls] if options.url else [None]
    return [
        vllm_engine(dataclasses.replace(options, url=url), python, loaded, trainer_host, art_path)
        for url in urls
    ]


def health_probe(base_url: str) -> Callable[[], str | None]:
    """Why the server at `base_url` does not answer GET /health with a 200, else None."""
    import httpx

    def probe() -> str | None:
        try:
            response = httpx.get(f"{base_url}/health", timeout=5.0)
        except httpx.HTTPError as error:
            return f"{base_url}/health does not answer ({type(error).__name__}: {error})"
        if response.status_code != 200:
            return f"{base_url}/health answers HTTP {response.status_code}"
        return None

    return probe


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
        unset_env=tuple(_OPENMP_SET_HERE),
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


def parse_threads(threads: str) -> int | None:
    """`--threads`: None for auto, else the fixed count; anything else is a clear error."""
    if threads == "auto":
        return None
    if not threads.isdigit() or int(threads) < 1:
        raise InvalidRequestError(f"--threads must be auto or a positive number, not {threads!r}")
    return int(threads)


def thread_governor(fixed: int | None, device: str, replicas: int = 1) -> ThreadGovernor | None:
    """Auto follows the cores other processes leave idle (CPU only); a number fixes the count.

    With torch-engine replicas in this process, each decodes on its share of the cores: two
    sets of spinning OpenMP threads on the same cores would wait on each other."""
    import torch

    from art_backend.engines._threads import ThreadGovernor

    if fixed is not None:
        torch.set_num_threads(fixed)
        return None
    if device != "cpu":
        return None  # the GPU computes; torch's CPU threads only feed it
    if replicas > 1:
        return ThreadGovernor(max(1, torch.get_num_threads() // replicas)).start()
    return ThreadGovernor().start()


def _share_of(governor: ThreadGovernor) -> ThreadGovernor:
    """Another replica's governor, with the same share of the cores."""
    from art_backend.engines._threads import ThreadGovernor

    return ThreadGovernor(governor.max_threads).start()


_OPENMP_SET_HERE: set[str] = set()  # not passed on to vLLM, which sets its own


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
