"""ART's `art.tinker_native`: ART code trained through the `tinker` SDK, against an art-server.

`TinkerNativeBackend` is a `RemoteBackend` whose training steps go through the Tinker API
(`forward_backward`, `optim_step`, `save_weights_for_sampler`) of the art-server at its base URL
(`base_url=`, else `TINKER_BASE_URL`, else a local art-server, http://127.0.0.1:8000); rollouts,
history, logging and the review page are that server's, as with any RemoteBackend.

    backend = TinkerNativeBackend()            # TINKER_API_KEY: the server's --api-key
    await model.register(backend)              # the model, and its Tinker training run
    result = await backend.train(model, groups, learning_rate=1e-5, loss_fn="cispo")

What differs from ART's own (which samples through Tinker and renders chats with the
cookbook's renderers): the model samples through the server's Chat Completions, whose records
hold each turn's exact prompt and sampled tokens and their logprobs, and a step trains on those:
one Tinker datum per recorded turn, its tokens' advantage the trajectory's (ART's group
normalization: reward minus the group's mean, divided by its standard deviation with
`normalize_advantages=True`). A group whose rewards are all equal teaches nothing and is left
out (counted in the metrics). A turn without a record (a plain-dict assistant message, or a
record already evicted) is not trained: counted too, never silently.

Not served: `kl_penalty_coef > 0` (a reference model's logprobs), `promote_if=`, `train_sft`
(the SDK's cross_entropy is there for code that wants it: `backend.training_client(model)`).
The `tinker` SDK is the extra `art[tinker]`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from art_core._adapter_start import read_adapter_start
from art_core.backend import ModelRef, RemoteBackend
from art_core.errors import UnsupportedOptionError
from art_core.training._rows import group_advantages as group_advantages
from art_core.training._rows import rl_rows, turn_datum
from art_core.trajectories import TrajectoryGroup
from art_core.types import TrainConfig, TrainResult, TrainSFTConfig

logger = logging.getLogger("art_core.tinker")

__all__ = ["TinkerNativeBackend", "turn_datum"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000"  # a local art-server
# The SDK refuses a key without this prefix; a server without --api-key takes any key.
KEY_PREFIX = "tml-"
LOSSES = ("cispo", "ppo", "importance_sampling")


@dataclass
class _Run:
    """A registered model's Tinker training run."""

    training: Any  # tinker.TrainingClient
    service: Any  # tinker.ServiceClient


def _tinker() -> Any:
    try:
        import tinker
    except ImportError as error:
        raise ImportError(
            "TinkerNativeBackend trains through the `tinker` SDK, which is not installed: "
            "pip install 'art[tinker]' (or pip install tinker)."
        ) from error
    return tinker


class TinkerNativeBackend(RemoteBackend):
    """ART's `TinkerNativeBackend`, training through the Tinker API of an art-server."""

    def __init__(
        self,
        *,
        tinker_api_key: str | None = None,
        path: str | None = None,
        base_url: str | None = None,
    ) -> None:
        """`tinker_api_key`: the server's --api-key (default TINKER_API_KEY). `path`: ART's
        local folder, kept for its signature; the server keeps the checkpoints (its --path)."""
        key = tinker_api_key or os.environ.get("TINKER_API_KEY")
        url = base_url or os.environ.get("TINKER_BASE_URL") or DEFAULT_BASE_URL
        super().__init__(url, key)
        self.path = path
        self._runs: dict[tuple[str, str], _Run] = {}

    def _sdk_key(self) -> str:
        key = self.api_key or f"{KEY_PREFIX}local"
        return key if key.startswith(KEY_PREFIX) else f"{KEY_PREFIX}{key}"

    async def register(self, model: ModelRef, **options: Any) -> dict[str, Any]:
        """Register the model on the server, then open its Tinker training run on it."""
        info = await super().register(model, **options)
        tinker = _tinker()
        service = tinker.ServiceClient(base_url=self.base_url, api_key=self._sdk_key())
        rank = int((info.get("lora") or {}).get("r") or 8)  # the registered model's rank
        start = read_adapter_start(model.base_model)  # a model started from a LoRA folder
        training = await service.create_lora_training_client(
            base_model=start.base_model if start is not None else model.base_model,
            rank=rank,
            user_metadata={"art_project": model.project, "art_name": model.name},
        )
        self._runs[(model.project, model.name)] = _Run(training, service)
        return info

    def training_client(self, model: ModelRef) -> Any:
        """The model's `tinker.TrainingClient` (registered first)."""
        run = self._runs.get((model.project, model.name))
        if run is None:
            raise RuntimeError(
                f"{model.name} has no Tinker training run yet: await model.register(backend) first."
            )
        return run.training

    async def train(  # type: ignore[override]
        self,
        model: ModelRef,
        trajectory_groups: Iterable[TrajectoryGroup] | TrajectoryGroup,
        config: TrainConfig | Mapping[str, Any] | None = None,
        *,
        learning_rate: float | None = None,
        loss_fn: str = "cispo",
        normalize_advantages: bool = True,
        save_checkpoint: bool = False,
        loss_fn_config: dict[str, Any] | None = None,
        adam_params: Any = None,
        kl_penalty_coef: float = 0.0,
        promote_if: Any = None,
        **unknown: Any,
    ) -> TrainResult:
        """One step through the Tinker API: ART's `TinkerNativeBackend.train` keywords."""
        _refuse_unserved(loss_fn, kl_penalty_coef, promote_if, unknown)
        training = self.training_client(model)
        tinker = _tinker()
        groups = (
            [trajectory_groups]
            if isinstance(trajectory_groups, TrajectoryGroup)
            else list(trajectory_groups)
        )
        datums, metrics = await self._datums(groups, normalize_advantages)
        step = await self.get_step(model)
        if not datums:
            logger.warning("Nothing trained this step (no group with varied rewards).")
            return TrainResult(step=step, metrics=metrics)
        if adam_params is None:
            rate = learning_rate or _config_rate(config) or 1e-5
            adam_params = tinker.AdamParams(learning_rate=rate, beta1=0.9, beta2=0.95, eps=1e-8)
        data = [
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(parts.pop("input")),
                loss_fn_inputs=parts,
            )
            for parts in datums
        ]
        # Both submitted before either is awaited (the SDK's pattern: no round trip between).
        backward = training.forward_backward(data, loss_fn, loss_fn_config)
        step_done = training.optim_step(adam_params)
        output, optimized = await backward, await step_done
        name = f"step_{step + 1:06d}"
        saved = await training.save_weights_for_sampler(name)
        if save_checkpoint:
            await training.save_state(name)
        metrics.update({key: float(value) for key, value in (output.metrics or {}).items()})
        metrics.update({key: float(value) for key, value in (optimized.metrics or {}).items()})
        metrics["data/step_num_datums"] = float(len(data))
        return TrainResult(
            step=await self.get_step(model),
            metrics=metrics,
            checkpoint_path=saved.path if save_checkpoint else None,
        )

    async def _datums(
        self, groups: list[TrajectoryGroup], normalize: bool
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The groups' recorded turns as datum parts, and the counts of what was left out."""
        rows, metrics = await rl_rows(self, groups, normalize)
        if metrics["data/step_turns_not_recorded"]:
            logger.warning(
                "%d assistant turns have no record on the server (plain messages, or evicted) "
                "and are not trained this step.",
                int(metrics["data/step_turns_not_recorded"]),
            )
        return [{k: v for k, v in row.items() if k != "policy_version"} for row in rows], metrics

    async def train_sft(
        self, model: ModelRef, trajectories: list[Any], config: TrainSFTConfig
    ) -> TrainResult:
        raise UnsupportedOptionError(
            "TinkerNativeBackend does not run train_sft (neither does ART's): train SFT with "
            "art.LocalBackend or art.RemoteBackend, or send cross_entropy datums through "
            "backend.training_client(model)."
        )

    async def close(self) -> None:
        for run in self._runs.values():
            run.service.close("success")
        self._runs.clear()
        await super().close()


def _config_rate(config: TrainConfig | Mapping[str, Any] | None) -> float | None:
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get("learning_rate")
    return config.learning_rate


def _refuse_unserved(
    loss_fn: str, kl_penalty_coef: float, promote_if: Any, unknown: Mapping[str, Any]
) -> None:
    if unknown:
        raise UnsupportedOptionError(
            f"TinkerNativeBackend.train(): {sorted(unknown)} not served; it takes ART's "
            "learning_rate, loss_fn, normalize_advantages, save_checkpoint, loss_fn_config, "
            "adam_params (and kl_penalty_coef=0)."
        )
    if loss_fn not in LOSSES:
        raise UnsupportedOptionError(
            f"loss_fn {loss_fn!r} is not served through the Tinker API here; use one of {LOSSES}."
        )
    if kl_penalty_coef:
        raise UnsupportedOptionError(
            "kl_penalty_coef > 0 is not served by TinkerNativeBackend (it needs a reference "
            "model's logprobs through Tinker); use art.LocalBackend, whose TrainConfig has it."
        )
    if promote_if is not None:
        raise UnsupportedOptionError(
            "promote_if= is not served by TinkerNativeBackend; use art.RemoteBackend on the "
            "same server for gated steps."
        )
