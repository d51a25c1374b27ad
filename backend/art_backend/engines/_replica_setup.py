"""How many engine replicas serve (`--replicas`, one per `--vllm-url`), the torch replicas'
copies of the weights, and the health probe of a replica behind a URL.

The `ReplicaSet` that routes across them is `_replicas.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from art_backend._errors import InvalidRequestError
from art_backend.engines._thread_settings import share_of

if TYPE_CHECKING:
    from art_backend.engines._vllm_options import VllmOptions


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
                threads=None if first.threads is None else share_of(first.threads),
            )
        )
    return engines


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
