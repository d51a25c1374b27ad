"""`ServerSettings`: what `art-server` is asked to serve and how, as one object.

`art-server`'s flags are parsed once (`cli._parser`) and become one `ServerSettings`
(`ServerSettings.from_arguments`); `cli.build_app(settings)` reads it to load the model, pick
and start the engine, the trainer and the app. Tests and benchmarks build one directly: every
field but `base_model` has the flag's default.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from art_backend._limits import DEFAULT_MAX_BODY_MB
from art_backend.engines._vllm_options import VllmOptions
from art_core._arguments import flag_values

# Fields whose flag has the same name (`--max-batch-size` -> max_batch_size).
SAME_NAMED_FLAGS = (
    "name dtype device api_key max_batch_size max_batch_tokens max_body_mb engine trainer "
    "train_processes threads replicas routing chat_template replica_api"
)


@dataclass(frozen=True)
class ServerSettings:
    """One server's settings; each field is the `art-server` flag named in its comment."""

    base_model: str  # --model: a local folder, a GGUF file, a hub id or an alias
    name: str | None = None  # --name: the served name (default: from the model)
    dtype: str = "auto"  # --dtype: auto, bfloat16 or float32
    device: str = "auto"  # --device: auto, cpu or cuda
    api_key: str | None = None  # --api-key: every route but /health needs it
    art_path: Path = Path(".art")  # --path: checkpoints, history, trajectories, decisions
    max_batch_size: int = 128  # --max-batch-size: rows decoded together (torch engine)
    max_batch_tokens: int = 65536  # --max-batch-tokens: bounds the KV cache
    # Host names a browser may reach it by besides localhost and IP addresses: the one the
    # server was bound by, and --allowed-hosts.
    allowed_hosts: list[str] | None = None
    max_body_mb: float = DEFAULT_MAX_BODY_MB  # --max-body-mb: larger bodies get a 413
    engine: str = "auto"  # --engine: auto, torch or vllm
    vllm: VllmOptions = field(default_factory=VllmOptions)  # the --vllm-* flags
    trainer: str = "torch"  # --trainer: torch or unsloth
    train_processes: int = 1  # --train-processes: data-parallel training processes
    threads: str = "auto"  # --threads: torch threads on a CPU, "auto" or a number
    # --replicas: torch-engine replicas (vLLM: one per --vllm-url), behind one ReplicaSet
    # that routes by --routing (docs/serving.md, "Engine replicas")
    replicas: int = 1
    routing: str = "sticky"  # --routing: sticky, least or random
    # --replica-url (repeated): art-servers on other hosts that decode as replicas of this one
    remote_replicas: tuple[str, ...] = ()
    replica_api: bool = False  # --replica-api: lend this engine to another server (/v1/engine)
    # --chat-template: a built-in template's name or a Jinja file, in place of the tokenizer's
    chat_template: str | None = None

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> ServerSettings:
        """The settings `art-server`'s parsed arguments ask for."""
        from art_backend._host_guard import allowed_hosts

        return cls(
            base_model=args.model,
            art_path=args.path,
            allowed_hosts=allowed_hosts(args.host, args.allowed_hosts),
            vllm=VllmOptions(
                python=args.vllm_python,
                url=args.vllm_url[0] if args.vllm_url else None,
                replica_urls=(args.vllm_url or [])[1:],
                max_lora_rank=args.max_lora_rank,
                kv_cache_gb=args.vllm_kv_cache_gb,
                sleep=args.vllm_sleep,
                devices=args.vllm_devices,
                args=args.vllm_arg,
            ),
            remote_replicas=tuple(args.replica_url),
            **flag_values(args, SAME_NAMED_FLAGS),
        )
