"""Models: `Model` (prompted, behind any OpenAI-compatible URL) and `TrainableModel` (LoRA on ours).

The served name of step N is `<name>@<N>`; `get_inference_name()` gives the promoted one (the
latest, unless a promotion gate refused later steps).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from openai import AsyncOpenAI
from pydantic import BaseModel

from art_core._clients import shared_client
from art_core._observers import StepObserver, observed_step
from art_core._promotion import PromotionGate
from art_core._unknown_fields import StrictModel, check_names
from art_core.adapter_leases import pinned_inference_name, pinned_inference_step
from art_core.backend import Backend
from art_core.capture._rollout import RolloutCapture
from art_core.dev import InternalModelConfig, model_settings, train_config
from art_core.errors import (
    InvalidTrajectoryError,
    ModelNotRegisteredError,
    NotTrainableError,
    UnsupportedOptionError,
)
from art_core.names import check_name
from art_core.trackers import LogObserver, observers_for
from art_core.trajectories import Trajectory, TrajectoryGroup
from art_core.types import LoRAConfig, TokenPrice, TrainConfig, TrainResult, TrainSFTConfig

__all__ = ["Model", "RolloutCapture", "TrainableModel"]

logger = logging.getLogger("art_core.model")

# Every backend a model was registered on (weakly: a closed, dropped backend goes away); capture
# scopes without `model=` tag requests to these hosts (art_core.capture._scopes).
registered_backends: weakref.WeakSet[Any] = weakref.WeakSet()

ConfigT = TypeVar("ConfigT", bound=StrictModel)

# The default of a required argument, so that a misspelt keyword (`nmae=`) is named with its
# closest spelling before Python would only say the right one is missing.
_REQUIRED: Any = object()


def _check_keywords(owner: str, unknown: Mapping[str, Any], init: Any, **required: Any) -> None:
    """Refuse keywords `init` does not take, naming the closest (as Trajectory's fields do)."""
    known = [name for name in inspect.signature(init).parameters if name not in ("self", "unknown")]
    check_names(f"{owner}()", unknown, known, hints=_CONSTRUCTOR_HINTS)
    missing = [name for name, value in required.items() if value is _REQUIRED]
    if missing:
        raise TypeError(f"{owner}() missing required argument(s): {', '.join(missing)}")


_CONSTRUCTOR_HINTS = {
    "path": "A model's files live in its backend's folder: art.LocalBackend(path=...).",
    "_internal_config": "Only a TrainableModel takes ART's _internal_config (art.dev.InternalModelConfig).",
}


class Model:
    """A model you prompt but do not train: a baseline, or a judge (any OpenAI-compatible URL).

    `Model(name="gpt-4.1-mini", base_url="https://api.openai.com/v1", api_key=...)`, or register
    it on one of our backends to prompt the base model it serves. `price` (dollars per million
    tokens) turns a judge's token usage into a cost in the step metrics.
    """

    trainable = False

    def __init__(
        self,
        name: str = _REQUIRED,
        *,
        project: str = "default",
        base_url: str | None = None,
        api_key: str | None = None,
        inference_model_name: str | None = None,
        price: TokenPrice | Mapping[str, float] | None = None,
        config: BaseModel | None = None,
        inference_base_url: str | None = None,
        inference_api_key: str | None = None,
        entity: str | None = None,
        id: str | None = None,
        **unknown: Any,
    ) -> None:
        """`inference_base_url` / `inference_api_key` are ART's names for `base_url` / `api_key`
        (give one of each pair). `config`: your own pydantic object, kept on the model as in ART
        (`model.config`); it must dump to JSON. `entity` and `id` (ART's W&B identity) are kept."""
        _check_keywords(type(self).__name__, unknown, Model.__init__, name=name)
        self.name = name
        self.price = None if price is None else _as_config(TokenPrice, price)
        self.project = check_name(project, "project name")
        self.base_url = _one_of("base_url", base_url, "inference_base_url", inference_base_url)
        self.api_key = _one_of("api_key", api_key, "inference_api_key", inference_api_key)
        self.inference_model_name = inference_model_name or name
        self.config = _checked_user_config(config)
        self.entity = entity
        self.id = id
        self._backend: Backend | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, project={self.project!r})"

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise ModelNotRegisteredError(
                f"{self!r} is not registered: call `await model.register(backend)` first."
            )
        return self._backend

    async def register(self, backend: Backend) -> None:
        """Prompt this model through `backend`'s OpenAI-compatible endpoint."""
        self._backend = backend
        registered_backends.add(backend)

    @property
    def inference_base_url(self) -> str | None:
        """The OpenAI-compatible base URL this model is prompted through (its backend's, once
        registered; else the `base_url` it was given; None when it has neither)."""
        return self._backend.inference_base_url if self._backend is not None else self.base_url

    @property
    def inference_api_key(self) -> str | None:
        """The API key for `inference_base_url` (None when the endpoint needs none)."""
        return self._backend.api_key if self._backend is not None else self.api_key

    def get_inference_name(self, step: int | None = None) -> str:
        """The `model` value for chat completions."""
        return self.inference_model_name

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """An AsyncOpenAI client on this model's endpoint, one per event loop (connections reused).

        Models on the same endpoint share it, and it lives as long as its loop, so dropping a model
        never drops live connections (see art_core._clients). Keyword arguments (timeout,
        max_retries, ...) give a copy with those options over the same connection pool.
        """
        base_url, api_key = self.inference_base_url, self.inference_api_key
        if base_url is None:
            raise ModelNotRegisteredError(
                f"{self!r} has no base_url and no backend: pass base_url= or register it."
            )
        client = shared_client(base_url, api_key)
        return client.with_options(**kwargs) if kwargs else client

    async def log(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Record groups (e.g. an evaluation) in the backend's history at the current step."""
        raise NotTrainableError(
            f"{self!r} is a prompted Model: only a TrainableModel has a history to log into."
        )

    async def get_step(self) -> int:
        """0: a prompted Model is never trained (ART's `Model.get_step`); TrainableModel asks its backend."""
        return 0

    async def train(self, *args: Any, **kwargs: Any) -> TrainResult:
        raise NotTrainableError(
            f"{self!r} is a prompted Model and cannot be trained: use art.TrainableModel."
        )


class TrainableModel(Model):
    """A LoRA adapter on `base_model`, trained with GRPO by the backend it is registered on."""

    trainable = True
    # The step the plain name serves when a promotion gate refused later ones; None: the latest.
    _promoted_step: int | None = None

    def __init__(
        self,
        name: str = _REQUIRED,
        *,
        project: str = "default",
        base_model: str = _REQUIRED,
        lora: LoRAConfig | Mapping[str, Any] | None = None,
        config: BaseModel | None = None,
        run_name: str | None = None,
        lora_config: LoRAConfig | Mapping[str, Any] | None = None,
        entity: str | None = None,
        id: str | None = None,
        run_id: str | None = None,
        base_path: str = ".art",
        report_metrics: Sequence[str | StepObserver] | None = None,
        _internal_config: InternalModelConfig | None = None,
        **unknown: Any,
    ) -> None:
        """ART's fields are accepted: `config` (your pydantic object, `model.config`),
        `lora_config` (ART's dict: rank, alpha, dropout, target_modules; or our `lora`),
        `run_name` (ART's durable tracker identity: the W&B/Trackio run's name and id; default
        `name`. The backend still stores and serves the model under `name`), `entity`, `id`,
        `run_id` (kept). The backend's `path` decides where files go, so `base_path` keeps its
        default; another value raises UnsupportedOptionError.

        `report_metrics`: the trackers told of every train step and log call (`model.observers`),
        by name (`["langfuse"]`, as installed: `art_core.trackers.tracker_names()`) or as
        `StepObserver` objects. None: the default trackers, each on when its settings are in the
        environment; `[]`: none. A named tracker that cannot run raises now, naming what is
        missing.

        `_internal_config` (ART's `art.dev.InternalModelConfig`): the keys `art_core.dev` lists
        are honoured (LoRA settings, the engine's dtype and batch size); others raise
        UnsupportedOptionError naming what to use here."""
        _check_keywords(
            type(self).__name__, unknown, TrainableModel.__init__, name=name, base_model=base_model
        )
        if (lora is not None or lora_config is not None) and any(
            key in (_internal_config or {}) for key in ("lora_config", "peft_args")
        ):
            raise UnsupportedOptionError(
                "TrainableModel: LoRA settings in _internal_config and in lora=/lora_config=: "
                "give them once."
            )
        super().__init__(
            check_name(name, "model name"), project=project, config=config, entity=entity, id=id
        )
        if base_path != ".art":
            raise UnsupportedOptionError(
                "TrainableModel: base_path is not used here: the backend's folder holds the "
                "model's files (art.LocalBackend(path=...))."
            )
        if lora is not None and lora_config is not None:
            raise UnsupportedOptionError("TrainableModel: pass lora= or lora_config=, not both.")
        self.run_name = name if run_name is None else check_name(run_name, "run name")
        self.run_id = run_id
        self.base_model = base_model
        self.lora_config = _lora_config(lora if lora_config is None else lora_config)
        self._internal_config = _internal_config
        self._step: int | None = None
        self._open_rollouts = 0
        # Counts the client makes between steps (calls no rollout could claim); sent with the
        # next train() as step metrics, then reset.
        self.pending_metrics: Counter[str] = Counter()
        # Told of every train step and log call (`report_metrics`); add your own.
        self.observers: list[StepObserver] = observers_for(report_metrics)

    def __getstate__(self) -> dict[str, Any]:
        """A detached copy for a rollout worker in another process (Ray, multiprocessing): its
        names, step, LoRA settings and backend (reached over HTTP), so `openai_client()`,
        `get_inference_name()` and `model.rollout()` work there. Not its trackers (they run
        where training runs) nor its pending counts (a worker's counts stay on the worker)."""
        return {**self.__dict__, "observers": [], "pending_metrics": Counter(), "_open_rollouts": 0}

    @property
    def _internal_config(self) -> InternalModelConfig | None:
        """ART's `art.dev.InternalModelConfig`, as last given."""
        return self._art_internal_config

    @_internal_config.setter
    def _internal_config(self, config: InternalModelConfig | None) -> None:
        """Validated and applied as the constructor does (ART's 2048 example sets it after
        construction): `engine_settings` (dtype, max_batch_size: read by LocalBackend when it
        starts; max_length: this model's default TrainConfig.max_length) and LoRA settings."""
        if self._backend is not None:
            raise UnsupportedOptionError(
                f"{self!r}._internal_config: set it before `model.register(backend)` (the backend "
                "has started the engine and created the adapter with the settings it had)."
            )
        settings = model_settings(config or {})
        if "lora" in settings:
            self.lora_config = _lora_config(settings.pop("lora"))
        self.engine_settings: dict[str, Any] = settings
        self._art_internal_config = config

    @property
    def open_rollouts(self) -> int:
        """How many `model.rollout()` scopes are open right now."""
        return self._open_rollouts

    async def register(
        self,
        backend: Backend,
        *,
        fork_from: TrainableModel | None = None,
        fork_step: int | None = None,
    ) -> None:
        """Create the model on `backend`, or resume it from its last complete checkpoint.

        `fork_from`: start from another model's checkpoint (its latest, or `fork_step`).
        """
        options: dict[str, Any] = {}
        if fork_from is not None:
            options["fork_from"] = {
                "project": fork_from.project,
                "name": fork_from.name,
                "step": fork_step,
            }
        info = await backend.register(self, **options)
        self._backend = backend
        registered_backends.add(backend)
        self._step = int(info["step"])
        self.promoted_step = int(info.get("promoted_step", self._step))

    @property
    def step(self) -> int:
        """The current step as last seen by this client (see `get_step` for the server's)."""
        if self._step is None:
            self.backend  # noqa: B018 - raises ModelNotRegisteredError
        return self._step or 0

    @step.setter
    def step(self, value: int) -> None:
        """Set by the backend when a step is trained (or a checkpoint resumed)."""
        self._step = value

    @property
    def promoted_step(self) -> int:
        """The step the plain name serves: the latest, unless a promotion gate refused later
        steps (`art.PromotionGate`); as last seen by this client."""
        return self.step if self._promoted_step is None else self._promoted_step

    @promoted_step.setter
    def promoted_step(self, value: int) -> None:
        """Set by the backend after a train step (the server's answer) and at registration."""
        self._promoted_step = None if value == self.step else value

    def get_inference_name(self, step: int | None = None) -> str:
        """`<name>@<step>`: the served adapter of the given step, else of the step pinned in
        this context (`backend.adapter_lease`, `art.adapter_leases`), else of the promoted one."""
        if pinned := pinned_inference_name(self.name, step):
            return pinned
        step = pinned_inference_step(self.name) if step is None else step
        return f"{self.name}@{self.promoted_step if step is None else step}"

    async def get_step(self) -> int:
        """The model's current step, from the backend."""
        self._step = await self.backend.get_step(self)
        return self._step

    async def train(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig | Mapping[str, Any] | None = None,
        *,
        langfuse: Any = None,
        promote_if: PromotionGate | None = None,
        _config: Mapping[str, Any] | None = None,
        **config_overrides: Any,
    ) -> TrainResult:
        """One GRPO step on these groups; the backend then serves `<name>@<step + 1>`.

        Our form, kept beside ART's `backend.train(model, groups, **ART keywords)` (which ART
        0.5.23 has in its place). `config_overrides` are TrainConfig fields
        (`learning_rate=1e-4`) over `config`; an unknown one raises `UnknownFieldError`. The
        model's trackers (`report_metrics`) are told of the step. `langfuse=` (deprecated: use
        `report_metrics`) still picks this call's Langfuse export.

        `promote_if=art.PromotionGate(...)`: the new step is evaluated on held-out data before
        the plain name and `get_inference_name()` move to it; a step whose metric drops by more
        than the gate's margin is kept on disk but not promoted (the gate's numbers are in the
        result's metrics; `PromotionGateError` if it could not evaluate).

        `_config=art.dev.TrainConfig(...)` (ART's experimental options): mapped by
        `art_core.dev.train_config` under `config` (a key with no counterpart is refused by name).
        """
        config = _config_with(
            TrainConfig,
            config,
            config_overrides,
            owner="model.train()",
            keywords=["config", "langfuse", "promote_if", "_config"],
        )
        if _config:
            config = train_config(_config, **config.model_dump(exclude_unset=True))
        return await self.backend.train(
            self, groups, config, promote_if=promote_if, **_deprecated_langfuse(langfuse)
        )

    async def train_sft(
        self,
        trajectories: list[Trajectory],
        config: TrainSFTConfig | Mapping[str, Any] | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        log_metrics: bool = True,
        **config_overrides: Any,
    ) -> TrainResult:
        """Supervised steps on the trajectories' assistant turns (a warm start before RL).

        `config_overrides` are TrainSFTConfig fields (`epochs=2`) over `config`. ART's other
        keywords: `verbose=True` logs the result's metrics; `log_metrics` is accepted for ART's
        signature (the server records every SFT step in the model's history either way, so a
        crash never loses what was trained); ART's experimental `_config` is refused when set.
        """
        if _config:
            raise UnsupportedOptionError(
                f"train_sft(_config={dict(_config)!r}): ART's experimental SFT settings have no "
                "counterpart here; use TrainSFTConfig fields (learning_rate, batch_size, "
                "assistant_turns, ...)."
            )
        config = _config_with(
            TrainSFTConfig, config, config_overrides, owner="model.train_sft()", keywords=["config"]
        )
        trajectories = list(trajectories)
        for index, trajectory in enumerate(trajectories):
            if not isinstance(trajectory, Trajectory):
                raise InvalidTrajectoryError(
                    f"trajectories[{index}] is a {type(trajectory).__name__}, not an "
                    "art.Trajectory (for groups: [t for g in groups for t in g])"
                )
        result = await self.backend.train_sft(self, trajectories, config)
        self._step = result.step
        self.promoted_step = result.step if result.promoted_step is None else result.promoted_step
        if verbose:
            logger.info("SFT step %d: %s", result.step, result.metrics)
        return result

    async def log(
        self,
        trajectories: Iterable[TrajectoryGroup] | Iterable[Trajectory] | None = None,
        split: str = "val",
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
        langfuse: Any = None,
    ) -> dict[str, Any]:
        """Record groups and/or metrics in the backend's history, at `step` (default: current).

        ART's signature: `trajectories` are groups (or trajectories, one group), `metrics` e.g.
        a TrainResult's. The rule, so that a step is never counted twice: `backend.train`
        writes the step's one "train" history row (and its trajectories); a log writes a "log"
        row, never a "train" one. A train-split log at a trained step,
        `model.log(groups, metrics=result.metrics, step=result.step, split="train")`, leaves
        out of its row the metrics the train row already holds with the same value, and does
        not write again the trajectories that step trained (the answer's `already_recorded`
        counts both). Returns {"step", "split", "metrics"[, "already_recorded"]}.
        The model's trackers see the groups (Langfuse exports them); `langfuse=` as in `train`.
        """
        groups = _as_groups(trajectories)
        if trajectories is None:  # a metrics-only log has no groups for the step observers
            answer = await self.backend.log(self, groups, split, metrics=metrics, step=step)
        else:
            async with observed_step(self, groups, split, _deprecated_langfuse(langfuse)):
                answer = await self.backend.log(self, groups, split, metrics=metrics, step=step)
        for observer in self.observers:
            if isinstance(observer, LogObserver):  # the experiment trackers: the row recorded
                observer.logged(
                    self,
                    groups,
                    split=answer.get("split", split),
                    step=int(answer.get("step", self.step)),
                    metrics=answer.get("metrics") or {},
                )
        return answer

    async def delete_checkpoints(
        self, best_checkpoint_metric: str = "val/reward", *, maximize: bool = True
    ) -> dict[str, Any]:
        """Delete all checkpoints except the latest and the best by a logged metric."""
        return await self.backend.delete_checkpoints(self, best_checkpoint_metric, maximize)

    @contextlib.asynccontextmanager
    async def rollout(self) -> AsyncIterator[RolloutCapture]:
        """Capture a rollout made by any client that only changes its `base_url`.

        `async with model.rollout() as r:` run the agent against `r.base_url` (model name
        `r.model`); after the block, `r.trajectory` holds every completion the server recorded
        for it, with their exact tokens, ready for a reward.
        """
        capture = RolloutCapture(self)
        self._open_rollouts += 1
        try:
            yield capture
        except BaseException as error:
            # The rule for a failed run (an exception, a timeout, a cancellation): it is not
            # trained. Its calls so far are kept on the exception for review, and released on
            # the server now rather than held for an hour.
            self._open_rollouts -= 1
            await capture.fail(error)
            raise
        self._open_rollouts -= 1
        await capture.collect()


def _config_with(
    config_class: type[ConfigT],
    config: ConfigT | Mapping[str, Any] | None,
    overrides: Mapping[str, Any],
    *,
    owner: str,
    keywords: list[str],
    hints: Mapping[str, str] | None = None,
) -> ConfigT:
    """`config` with keyword `overrides` on top, validated as a whole (a typo names itself)."""
    check_names(owner, overrides, [*config_class.model_fields, *keywords], hints=hints)
    if config is None:
        base: dict[str, Any] = {}
    elif isinstance(config, config_class):
        base = config.model_dump(exclude_unset=True)
    elif isinstance(config, Mapping):
        base = dict(config)
    else:
        raise TypeError(
            f"{owner}: config must be an art.{config_class.__name__} (or a dict of its "
            f"fields), got {type(config).__name__}"
        )
    # Constructed, not model_copy(update=...): an update skips validation entirely.
    return config_class(**{**base, **overrides})


def _one_of(name: str, value: str | None, art_name: str, art_value: str | None) -> str | None:
    """One value given under our name or ART's; both is an error."""
    if value is not None and art_value is not None:
        raise UnsupportedOptionError(f"Model: {name} and {art_name} are one option: pass one.")
    return value if value is not None else art_value


def _checked_user_config(config: BaseModel | None) -> BaseModel | None:
    """ART's `config`: a pydantic object of the user's, which must dump to JSON."""
    if config is None:
        return None
    if not isinstance(config, BaseModel):
        raise TypeError(
            f"Model: config must be a pydantic BaseModel (ART's model config), got "
            f"{type(config).__name__}"
        )
    try:
        config.model_dump_json()
    except Exception as error:
        raise TypeError(
            f"Model: config cannot be serialized to JSON ({error}); make every field of "
            f"{type(config).__name__} JSON-serializable."
        ) from error
    return config


# ART's LoRA dict keys (src/art/dev/model.py LoRAConfig) that have a field here.
_ART_LORA_KEYS = {"rank": "r", "alpha": "alpha", "dropout": "dropout"}


def _lora_config(value: LoRAConfig | Mapping[str, Any] | None) -> LoRAConfig:
    """Our LoRAConfig, from ours, a dict of its fields, or ART's `lora_config` dict."""
    if value is None:
        return LoRAConfig()
    if isinstance(value, Mapping) and any(key in value for key in ("rank", *_ART_ONLY_LORA)):
        fields = {}
        for key, item in value.items():
            if key in _ART_LORA_KEYS:
                fields[_ART_LORA_KEYS[key]] = item
            elif key == "target_modules":
                fields[key] = list(item)
            else:
                raise UnsupportedOptionError(
                    f"TrainableModel: lora_config[{key!r}] (ART's) is not supported here; "
                    "its keys here are rank, alpha, dropout and target_modules."
                )
        return LoRAConfig(**fields)
    return _as_config(LoRAConfig, value)


_ART_ONLY_LORA = (
    "bias", "layers_to_transform", "layers_pattern", "use_gradient_checkpointing",
    "random_state", "max_seq_length", "use_rslora", "modules_to_save", "init_weights",
    "loftq_config", "temporary_location",
)  # fmt: skip


def _as_groups(
    trajectories: Iterable[TrajectoryGroup] | Iterable[Trajectory] | TrajectoryGroup | None,
) -> list[TrajectoryGroup]:
    """ART's `trajectories` of `log`: groups, or trajectories (one group), or None."""
    if trajectories is None:
        return []
    if isinstance(trajectories, TrajectoryGroup):
        return [trajectories]
    items: list[Any] = list(trajectories)
    if items and all(isinstance(item, Trajectory | BaseException) for item in items):
        return [TrajectoryGroup(items)]
    return items  # the backend names an item that is not a group


def _as_config(config_class: type[ConfigT], value: ConfigT | Mapping[str, Any]) -> ConfigT:
    """`value`, or a dict of its fields constructed as `config_class` (typos named)."""
    return (
        config_class(**value) if isinstance(value, Mapping) else config_class.model_validate(value)
    )


def _deprecated_langfuse(langfuse: Any) -> dict[str, Any]:
    """A call's `langfuse=` as the observers' option; it warns: the model's trackers decide."""
    if langfuse is None:
        return {}
    warnings.warn(
        "langfuse= on a call is deprecated and goes in the next release: configure trackers on "
        "the model, TrainableModel(..., report_metrics=['langfuse']) (or []: none).",
        DeprecationWarning,
        stacklevel=3,
    )
    return {"langfuse": langfuse}
