"""The Backend protocol and `RemoteBackend`, which talks to a running `art-server` over HTTP.

`LocalBackend` (in `art_core.local`) is a RemoteBackend that first starts the server in a
child process; both share every request below, so one test suite covers both.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, cast, runtime_checkable

import httpx
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from art_core._adapter_start import lora_for_adapter, read_adapter_start
from art_core._art_experimental import ArtExperimentalCalls
from art_core._checkpoint_leases import CheckpointLeases
from art_core._observers import observed_step
from art_core._promotion import PromotionGate
from art_core._unknown_fields import check_names
from art_core.dev import art_train_options, train_config
from art_core.errors import (
    BackendCrashedError,
    BackendRequestError,
    InvalidTrajectoryError,
    UnsupportedOptionError,
)
from art_core.trajectories import Trajectory, TrajectoryGroup, group_payload
from art_core.types import (
    LoRAConfig,
    TrainConfig,
    TrainResult,
    TrainSFTConfig,
    train_config_from_art,
)
from art_core.utils._signal import hint_zero_variance
from art_core.wire import (
    DeleteCheckpointsRequest,
    GroupPayload,
    LogRequest,
    PromoteRequest,
    RegisterRequest,
    SFTRequest,
    TrainRequest,
)

__all__ = ["Backend", "RemoteBackend"]

logger = logging.getLogger("art_core.backend")

TRAIN_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)


class ModelRef(Protocol):
    """What a backend reads from a trainable model: which one it is and what it trains.

    (A protocol rather than `TrainableModel` itself: the model calls its backend, so the
    backend module must not import the model's.)
    """

    project: str
    name: str
    base_model: str
    lora_config: LoRAConfig


@runtime_checkable
class Backend(Protocol):
    """What a model needs from a backend: serving URLs and the training calls."""

    @property
    def inference_base_url(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    def rollout_base_url(self, rollout_id: str) -> str: ...
    async def register(self, model: ModelRef, **options: Any) -> dict[str, Any]: ...
    async def train(
        self,
        model: ModelRef,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | Mapping[str, Any] | None = None,
        *,
        client_metrics: Mapping[str, float] | None = None,
        promote_if: PromotionGate | None = None,
        **options: Any,
    ) -> TrainResult: ...
    async def train_sft(
        self, model: ModelRef, trajectories: list[Trajectory], config: TrainSFTConfig
    ) -> TrainResult: ...
    async def log(
        self,
        model: ModelRef,
        groups: list[TrajectoryGroup],
        split: str,
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> dict[str, Any]: ...
    async def get_step(self, model: ModelRef) -> int: ...
    async def history(self, model: ModelRef) -> list[dict[str, Any]]: ...
    async def delete_checkpoints(
        self, model: ModelRef, best_checkpoint_metric: str, maximize: bool
    ) -> dict[str, Any]: ...
    async def delete_checkpoint_steps(
        self, model: ModelRef, steps: list[int]
    ) -> dict[str, Any]: ...
    async def checkpoint_steps(self, model: ModelRef) -> list[int]: ...
    async def rollout_records(self, rollout_id: str) -> list[dict[str, Any]]: ...
    async def discard_rollout(self, rollout_id: str) -> int: ...
    async def close(self) -> None: ...


class RemoteBackend(CheckpointLeases, ArtExperimentalCalls):
    """A backend already running at `base_url` (an `art-server`), with its API key if it has one."""

    def __init__(self, base_url: str, api_key: str | None = None, **unknown: Any) -> None:
        check_names(f"{type(self).__name__}()", unknown, ["base_url", "api_key"])
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self._api_key = api_key
        self._http: httpx.AsyncClient | None = None

    @property
    def inference_base_url(self) -> str:
        """The OpenAI-compatible base URL (ends in /v1)."""
        return f"{self.base_url}/v1"

    @property
    def api_key(self) -> str | None:
        return self._api_key

    def rollout_base_url(self, rollout_id: str) -> str:
        """A base URL whose completions are recorded under `rollout_id` (zero-change capture)."""
        return f"{self.base_url}/rollouts/{rollout_id}/v1"

    # ------------------------------------------------------------------------------- requests

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=TRAIN_TIMEOUT
            )
        return self._http

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = await self._client().request(method, path, json=body)
        except httpx.TransportError as error:
            raise self._unreachable(error) from error
        _raise_for_status(response)
        return response.json()

    async def _events(self, path: str, body: Any) -> dict[str, Any]:
        """POST and read NDJSON events until the result; log queue notices and progress."""
        try:
            async with self._client().stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for_status(response)
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "queued":
                        logger.warning(
                            "another training step is running on this backend: this one is queued "
                            "(%d ahead)", event["ahead"],
                        )  # fmt: skip
                    elif event["type"] == "review_hold":
                        logger.warning(
                            "step %d is held for review for up to %g s: %s%s "
                            "(flag or approve it there)",
                            event["step"], event["seconds"], self.base_url, event["review_path"],
                        )  # fmt: skip
                    elif event["type"] == "error":
                        raise BackendRequestError(event["message"], status_code=event["status"])
                    elif event["type"] == "result":
                        return event
        except httpx.TransportError as error:
            raise self._unreachable(error) from error
        raise BackendCrashedError(
            f"The backend at {self.base_url} closed the training stream without a result: "
            "it probably crashed mid-step. The last complete checkpoint is intact; restart it "
            "and register the model again to resume."
        )

    def _unreachable(self, error: Exception) -> Exception:
        return BackendCrashedError(f"The backend at {self.base_url} is unreachable: {error}")

    # ---------------------------------------------------------------------------- the protocol

    def _model_path(self, model: ModelRef) -> str:
        return f"/v1/training/models/{model.project}/{model.name}"

    async def register(self, model: ModelRef, **options: Any) -> dict[str, Any]:
        body = {
            "project": model.project,
            "name": model.name,
            "base_model": model.base_model,
            "lora": model.lora_config,
            **options,
        }
        start = read_adapter_start(model.base_model)
        if start is not None:  # ART's warm start: the adapter folder named as the base model
            default = type(model.lora_config)() if model.lora_config is not None else None
            body |= {
                "base_model": start.base_model,
                "lora": lora_for_adapter(start, model.lora_config, default),
                "init_adapter": start.folder,
            }
        return await self._request("POST", "/v1/training/models", _wire(RegisterRequest, body))

    async def train(
        self,
        model: ModelRef,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | Mapping[str, Any] | None = None,
        *,
        client_metrics: Mapping[str, float] | None = None,
        langfuse: Any = None,
        promote_if: PromotionGate | None = None,
        **options: Any,
    ) -> TrainResult:
        """One training step on these groups; the backend then serves `<name>@<step + 1>`.

        Two forms, not mixed. ART's: keywords of ART 0.5.23's `LocalBackend.train`
        (`learning_rate=5e-6, loss_fn="cispo"|"ppo", epsilon=..., importance_sampling_level=...`,
        ART's defaults for the rest; see `art.TrainConfig` and `train_config_from_art`), plus our
        TrainConfig fields ART lacks (`micro_batch_tokens=`, `review_hold_seconds=`, ...). Ours:
        `config=art.TrainConfig(...)`. An unknown keyword raises `UnknownFieldError` naming the
        known ones; a value this backend cannot honour, `UnsupportedOptionError`.

        As ART's, the step is not logged by `model.log`: the backend records it in history
        itself (see `model.log` for the rule). A TrainableModel's trackers are told of the step
        (`observed_step`) and the counts it made between steps go with it; `client_metrics` adds
        counts of the caller's own. `langfuse=` (deprecated) as in `model.train`.

        `promote_if=art.PromotionGate(...)`: the step is evaluated before the plain name serves
        it (see `art_core._promotion`); a step the gate could not judge raises
        `PromotionGateError` once it is recorded (its result on the error).
        """
        config, save_checkpoint, verbose = _train_config(config, options)
        # ART's _internal_config max_seq_length: the model's longest row, unless the step sets one.
        model_length = getattr(model, "engine_settings", {}).get("max_length")
        if model_length is not None and config.max_length is None:
            config = TrainConfig(
                **{**config.model_dump(exclude_unset=True), "max_length": model_length}
            )
        # A gathered list keeps its `dropped` count (groups a judge dropped) for the metrics.
        dropped = float(getattr(trajectory_groups, "dropped", 0))
        if isinstance(trajectory_groups, TrajectoryGroup):
            groups = [trajectory_groups]
        else:
            groups = list(trajectory_groups)
        counts = {key: float(value) for key, value in (client_metrics or {}).items()}
        # A GroupSignal's counts of the step (skipped scenarios, extra groups), when gathered so.
        counts.update(getattr(trajectory_groups, "counts", None) or {})
        options = {} if langfuse is None else {"langfuse": langfuse}
        if promote_if is not None and not isinstance(promote_if, PromotionGate):
            raise TypeError(
                f"backend.train(): promote_if must be an art.PromotionGate, got "
                f"{type(promote_if).__name__}"
            )
        gate_error = None
        async with observed_step(model, groups, "train", options) as step:
            for key, value in step.pending.items():
                counts[key] = counts.get(key, 0.0) + value

            async def train_step(promote: bool, train_from_step: int | None) -> TrainResult:
                return await self._train_step(
                    model, groups, config, dropped, counts, promote, train_from_step
                )

            if promote_if is None:
                result = await train_step(True, None)
            else:
                result, gate_error = await promote_if.gated_step(model, self, train_step)
            step.result = result
        hint_zero_variance(model, result.metrics, counts)
        if result.promoted_step is not None and hasattr(model, "promoted_step"):
            model.promoted_step = result.promoted_step
        if gate_error is not None:
            raise gate_error
        if not save_checkpoint:
            result.checkpoint_path = None
        if verbose:
            logger.info("step %d: %s", result.step, result.metrics)
        return result

    async def _train_step(
        self,
        model: ModelRef,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        dropped: float,
        client_metrics: Mapping[str, float],
        promote: bool = True,
        train_from_step: int | None = None,
    ) -> TrainResult:
        """The train request itself; `client_metrics` are counts made by the client."""
        # Sent only when asked for: a server that predates promotion takes the usual request.
        gate: dict[str, Any] = {} if promote else {"promote": False}
        if train_from_step is not None:
            gate["train_from_step"] = train_from_step
        request = TrainRequest(
            **gate,
            groups=self._groups_payload(groups),
            config=config,
            client_metrics={
                # Groups an `after_each` (a judge that failed) dropped during the gather.
                "groups/dropped_before_training": dropped,
                **client_metrics,
            },
        )
        event = await self._events(f"{self._model_path(model)}/train", _json(request))
        return _result(event)

    async def train_sft(
        self, model: ModelRef, trajectories: list[Trajectory], config: TrainSFTConfig
    ) -> TrainResult:
        body = {
            "trajectories": [{"messages": t.messages(), "tools": t.tools} for t in trajectories],
            "config": config,
        }
        event = await self._events(f"{self._model_path(model)}/sft", _wire(SFTRequest, body))
        return _result(event)

    async def log(
        self,
        model: ModelRef,
        groups: list[TrajectoryGroup],
        split: str,
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Record groups and/or metrics in the model's history (the rule: `TrainableModel.log`)."""
        body: dict[str, Any] = {"groups": self._groups_payload(groups), "split": split}
        if metrics:
            body["metrics"] = {key: float(value) for key, value in metrics.items()}
        if step is not None:
            body["step"] = step
        return await self._request(
            "POST", f"{self._model_path(model)}/log", _wire(LogRequest, body)
        )

    async def record_tracker_run(self, model: ModelRef, run: Mapping[str, str | None]) -> None:
        """Record where an experiment tracker shows the model's run (a "tracker" history row:
        tracker, run_id, url or how_to_open), for the review page."""
        body = {"tracker": dict(run), "groups": []}
        await self._request("POST", f"{self._model_path(model)}/log", _wire(LogRequest, body))

    async def get_step(self, model: ModelRef) -> int:
        info = await self._request("GET", self._model_path(model))
        return int(info["step"])

    async def promoted_step(self, model: ModelRef) -> int:
        """The step the model's plain name serves (its latest, unless a gate refused steps)."""
        info = await self._request("GET", self._model_path(model))
        return int(info.get("promoted_step", info["step"]))

    async def promote(
        self,
        model: ModelRef,
        step: int,
        *,
        promote: bool = True,
        metrics: Mapping[str, float] | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Point the plain name at `step` (promote=False: record that `step` was refused);
        `metrics` and `details` go into the history's "promotion" row. Returns the model info."""
        body = {
            "step": step,
            "promote": promote,
            "metrics": dict(metrics or {}),
            "details": dict(details or {}),
        }
        return await self._request(
            "POST", f"{self._model_path(model)}/promote", _wire(PromoteRequest, body)
        )

    async def history(self, model: ModelRef) -> list[dict[str, Any]]:
        """The model's history rows (one per train step and per log call)."""
        return (await self._request("GET", f"{self._model_path(model)}/history"))["rows"]

    async def delete_checkpoints(
        self, model: ModelRef, best_checkpoint_metric: str, maximize: bool
    ) -> dict[str, Any]:
        """Delete every checkpoint but the latest, the best by a logged metric and the leased."""
        body = {"best_checkpoint_metric": best_checkpoint_metric, "maximize": maximize}
        return await self._delete_checkpoints(model, body)

    async def delete_checkpoint_steps(self, model: ModelRef, steps: list[int]) -> dict[str, Any]:
        """Delete exactly these checkpoint steps (never the latest: that is a 400); a step an
        adapter lease holds is skipped and named in the answer's `held`."""
        return await self._delete_checkpoints(model, {"steps": list(steps)})

    async def _delete_checkpoints(self, model: ModelRef, body: dict[str, Any]) -> dict[str, Any]:
        if leased := self.leased_steps(model):  # sent only when held: older servers take the rest
            body["keep"] = leased
        body = _wire(DeleteCheckpointsRequest, body)
        answer = await self._request("POST", f"{self._model_path(model)}/delete_checkpoints", body)
        if answer.get("held"):
            logger.info("checkpoint steps %s kept: an adapter lease holds them", answer["held"])
        return cast(dict[str, Any], answer)

    async def checkpoint_steps(self, model: ModelRef) -> list[int]:
        """The steps the model has a complete checkpoint for, oldest first."""
        info = await self._request("GET", self._model_path(model))
        return [int(step) for step in info["checkpoints"]]

    async def rollout_records(self, rollout_id: str) -> list[dict[str, Any]]:
        return (await self._request("GET", f"/v1/rollouts/{rollout_id}"))["completions"]

    async def discard_rollout(self, rollout_id: str) -> int:
        """Release the records of a rollout that will not be trained; returns how many."""
        result = await self._request("DELETE", f"/v1/rollouts/{rollout_id}")
        return int(result["discarded"])

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for a rollout worker in another process) without its HTTP client, which
        holds locks and sockets (the copy opens its own on its first request), nor the leases
        held here."""
        return {**self.__dict__, "_http": None, "_adapter_lease_managers": {}}

    @staticmethod
    def _groups_payload(groups: list[TrajectoryGroup]) -> list[GroupPayload]:
        if isinstance(groups, TrajectoryGroup):
            groups = [groups]
        payload = []
        for index, group in enumerate(groups):
            if not isinstance(group, TrajectoryGroup):
                raise InvalidTrajectoryError(
                    f"groups[{index}] is a {type(group).__name__}, not an art.TrajectoryGroup"
                )
            try:
                payload.append(group_payload(group))
            except InvalidTrajectoryError as error:
                raise InvalidTrajectoryError(f"groups[{index}]: {error}") from error
        return payload


def _train_config(
    config: TrainConfig | Mapping[str, Any] | None, options: dict[str, Any]
) -> tuple[TrainConfig, bool, bool]:
    """`backend.train`'s config in one of its two forms, with ART's `save_checkpoint` and
    `verbose` (client-side keywords: True and False unless ART's form sets them). ART's
    `_config` (art.dev.TrainConfig) goes with either (`art_core.dev`)."""
    dev_config = options.pop("_config", None) or {}
    if config is None and dev_config:
        options = art_train_options(dev_config, options)
    elif dev_config and config is not None:
        config = train_config(dev_config, **_as_train_config(config).model_dump(exclude_unset=True))
    if config is not None and options:
        raise UnsupportedOptionError(
            f"backend.train(): pass either config=art.TrainConfig(...) or ART's keywords "
            f"({', '.join(sorted(options))}), not both: put them in the TrainConfig."
        )
    if config is None:
        from_art, client = train_config_from_art(options)
        return from_art, client["save_checkpoint"], client["verbose"]
    return _as_train_config(config), True, False


def _as_train_config(config: TrainConfig | Mapping[str, Any]) -> TrainConfig:
    if isinstance(config, Mapping):
        return TrainConfig(**config)
    if not isinstance(config, TrainConfig):
        raise TypeError(
            "backend.train(): config must be an art.TrainConfig (or a dict of its fields), "
            f"got {type(config).__name__}"
        )
    return config


def _json(request: BaseModel) -> dict[str, Any]:
    """A request of `art_core.wire` as its JSON body: what was set, so that an option left out
    keeps the server's default (and a choice between two forms stays the one made)."""
    return request.model_dump(mode="json", exclude_unset=True)


def _wire(request_class: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """`body` built as the wire class the server validates. A body the class refuses (a caller's
    bad option) goes as it is: the server answers with its 400, which names the field."""
    try:
        return _json(request_class.model_validate(body))
    except ValidationError:
        return cast(dict[str, Any], to_jsonable_python(body, exclude_none=True))


def new_rollout_id() -> str:
    return "rollout-" + secrets.token_hex(8)


def _result(event: dict[str, Any]) -> TrainResult:
    result = TrainResult(
        step=event["step"],
        metrics=event["metrics"],
        warnings=event["warnings"],
        advantages=event.get("advantages", {}),
        checkpoint_path=event.get("checkpoint_path"),
        promoted_step=event.get("promoted_step"),
    )
    for warning in result.warnings:
        logger.warning(warning)
    return result


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        message = error["message"]
        if error.get("param"):
            message = f"{message} (param: {error['param']})"
    except (ValueError, KeyError, TypeError):
        message = response.text[:500] or response.reason_phrase
    raise BackendRequestError(message, status_code=response.status_code)
