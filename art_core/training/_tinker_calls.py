"""The training client's calls, as the `tinker` SDK makes them to the model's art-server.

A registered model's Tinker training run is the one its `TinkerNativeBackend` opened, or a new
session on the model's server naming the model (`art_project`, `art_name`), which the server
resolves to the model's own adapter and history. Rows become Tinker datums here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from art_core._adapter_start import read_adapter_start
from art_core.training.contracts import AdamConfig, PackingOutcome, PolicyTokenCount

__all__ = ["TinkerRun", "open_tinker_run", "packing_of"]

KEY_PREFIX = "tml-"  # the SDK refuses a key without it; a server without --api-key takes any
LOSS_KEYS = ("target_tokens", "logprobs", "advantages", "weights")


def _tinker() -> Any:
    try:
        import tinker
    except ImportError as error:
        raise ImportError(
            "art.training's TrainingClient drives the server's Tinker API through the `tinker` "
            "SDK, which is not installed: pip install 'art[tinker]' (or pip install tinker)."
        ) from error
    return tinker


@dataclass
class TinkerRun:
    """A `tinker.TrainingClient` and, when this client opened it, its session to close."""

    training: Any
    service: Any | None

    def _datums(self, rows: list[dict[str, Any]]) -> list[Any]:
        tinker = _tinker()
        return [
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(row["input"]),
                loss_fn_inputs={key: row[key] for key in LOSS_KEYS if key in row},
            )
            for row in rows
        ]

    def forward(
        self, rows: list[dict[str, Any]], loss: str, config: Mapping[str, Any] | None
    ) -> Any:
        """Submit a forward (no gradient); an awaitable of its output."""
        return self.training.forward(self._datums(rows), loss, config)

    def forward_backward(
        self, rows: list[dict[str, Any]], loss: str, config: Mapping[str, Any] | None
    ) -> Any:
        """Submit a forward-backward; an awaitable of its output."""
        return self.training.forward_backward(self._datums(rows), loss, config)

    def optim_step(self, adam: AdamConfig) -> Any:
        """Submit an AdamW step with these settings."""
        params = _tinker().AdamParams(**adam.model_dump())
        return self.training.optim_step(params)

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None) -> Any:
        """Submit a save of the sampler weights."""
        return self.training.save_weights_for_sampler(name, ttl_seconds=ttl_seconds)

    def save_state(self, name: str, ttl_seconds: int | None, overwrite: bool) -> Any:
        """Submit a save of weights and optimizer state."""
        return self.training.save_state(name, ttl_seconds=ttl_seconds, overwrite=overwrite)

    def load_state(self, path: str, restore_optimizer: bool) -> Any:
        """Submit a load of saved weights (and optimizer state)."""
        if restore_optimizer:
            return self.training.load_state_with_optimizer(path)
        return self.training.load_state(path)

    def close(self) -> None:
        """End the session this client opened (a backend's own stays open)."""
        if self.service is not None:
            self.service.close("success")
            self.service = None


async def open_tinker_run(backend: Any, model: Any) -> TinkerRun:
    """The model's Tinker training run on its backend's server."""
    from art_core.tinker_native import TinkerNativeBackend

    if isinstance(backend, TinkerNativeBackend):
        return TinkerRun(backend.training_client(model), None)
    base_url = getattr(backend, "base_url", None)
    if base_url is None:
        raise TypeError(
            f"{type(backend).__name__} has no art-server to train through; register the model "
            "with art.LocalBackend(), art.RemoteBackend(url) or TinkerNativeBackend."
        )
    tinker = _tinker()
    key = backend.api_key or f"{KEY_PREFIX}local"
    service = tinker.ServiceClient(
        base_url=base_url, api_key=key if key.startswith(KEY_PREFIX) else f"{KEY_PREFIX}{key}"
    )
    start = read_adapter_start(model.base_model)  # a model started from a LoRA folder
    training = await service.create_lora_training_client(
        base_model=start.base_model if start is not None else model.base_model,
        rank=model.lora_config.r,
        user_metadata={"art_project": model.project, "art_name": model.name},
    )
    return TinkerRun(training, service)


def packing_of(rows: list[dict[str, Any]]) -> PackingOutcome:
    """What the rows hold: count, lengths, the tokens carrying the loss, by policy version."""
    lengths = [len(row["input"]) for row in rows]
    longest = max(lengths)
    per_version: Counter[int] = Counter()
    bearing = 0
    versions_known = True
    for row in rows:
        loss = row.get("advantages") or row.get("weights") or []
        tokens = sum(1 for value in loss if value != 0)
        bearing += tokens
        if row.get("policy_version") is None:
            versions_known = False
        elif tokens:
            per_version[row["policy_version"]] += tokens
    counts = (
        tuple(
            PolicyTokenCount(policy_version=v, trainable_assistant_tokens=n)
            for v, n in sorted(per_version.items())
        )
        if versions_known
        else None
    )
    return PackingOutcome(
        packed_sequence_length=longest,
        packed_sequences=len(rows),
        target_packed_sequences=len(rows),
        nominal_capacity_tokens=longest * len(rows),
        physical_tokens=sum(lengths),
        non_padding_tokens=sum(lengths),
        loss_bearing_tokens=bearing,
        trainable_assistant_tokens=bearing,
        policy_token_counts=counts,
    )
