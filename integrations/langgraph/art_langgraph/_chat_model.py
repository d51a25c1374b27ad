"""`TrainableChatModel`: a LangChain chat model served by our backend, for any LangChain or
LangGraph code (invoke, stream, batch, bind_tools, with_structured_output, callbacks, usage).

It is `ChatOpenAI` pointed at the backend, with two changes made where every request is built:
the model name follows the trained step (`name@step`), and inside a rollout the request carries
`X-Rollout-Id`, so the server records the call's exact prompt and sampled tokens into that
rollout. Nothing is re-tokenized or reconstructed afterwards.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_openai import ChatOpenAI
from pydantic import Field

import art_core as art
from art_langgraph._scope import NoRolloutError, current_rollout

logger = logging.getLogger("art_langgraph")


class TrainableChatModel(ChatOpenAI):
    """A chat model for `art_model` (an `art.TrainableModel` or prompted `art.Model`) on our backend."""

    art_model: Any = Field(default=None, exclude=True)

    def __init__(self, art_model: art.Model, **kwargs: Any) -> None:
        # A model registered on a backend, or a prompted art.Model with its own base_url.
        base_url, api_key = art_model.inference_base_url, art_model.inference_api_key
        if base_url is None:
            art_model.backend  # noqa: B018 - raises ModelNotRegisteredError, which says what to do
        defaults = {
            "model": art_model.get_inference_name(),  # requests use the current step's name
            "base_url": base_url,
            "api_key": api_key or "unused",
            "stream_usage": True,  # our server sends usage in the last stream chunk
        }
        super().__init__(art_model=art_model, **{**defaults, **kwargs})

    @classmethod
    def is_lc_serializable(cls) -> bool:
        # It wraps a live art model (its backend, its step); LangChain's serialization would
        # revive a plain ChatOpenAI pointed at a port that no longer exists.
        return False

    @property
    def _llm_type(self) -> str:
        return "art-trainable-chat"

    def _get_request_payload(
        self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        payload["model"] = self.art_model.get_inference_name()  # the newest step, always
        scope = current_rollout()
        if scope is not None:
            payload["extra_headers"] = {
                **(payload.get("extra_headers") or {}),
                "X-Rollout-Id": scope.id,
            }
        elif getattr(self.art_model, "open_rollouts", 0):
            _count_unplaced_call(self.art_model)
        return payload


def _count_unplaced_call(model: art.TrainableModel) -> None:
    """A call outside every rollout while rollouts are open: its run lost the scope, typically a
    thread started without the caller's context. It cannot be placed in any trajectory."""
    model.pending_metrics["dropped/calls_outside_rollout"] += 1
    if model.pending_metrics["dropped/calls_outside_rollout"] == 1:
        logger.warning(
            "%s: a chat model call ran outside any rollout while rollouts are open, so it is "
            "not in any trajectory (counted in the next step's metrics as "
            "'dropped/calls_outside_rollout'). A thread started by hand does not inherit the "
            "rollout: start it with contextvars.copy_context().run, or use LangGraph's nodes, "
            "which do.",
            model.name,
        )


def init_chat_model(
    model: art.Model | str | None = None,
    *,
    model_provider: str | None = None,
    configurable_fields: None = None,
    config_prefix: str | None = None,
    **kwargs: Any,
) -> TrainableChatModel:
    """A `TrainableChatModel` for `model`, or for the current rollout's model.

    ART's signature: `init_chat_model(model.name, temperature=1.0)` inside a rollout names the
    rollout's model by name (`name` or its `name@step`); omitted, it is the rollout's model too.
    `model_provider` ("openai" or None: the backend's endpoint is OpenAI-compatible) and
    `config_prefix` (unused without configurable fields) are accepted as ART accepts them; other
    keywords go to `ChatOpenAI`.
    """
    if configurable_fields is not None:
        raise art.UnsupportedOptionError(
            "init_chat_model(configurable_fields=...) is not supported: the model is the "
            "rollout's trainable model. Pass ChatOpenAI keywords (temperature=...) instead."
        )
    if model_provider not in (None, "openai"):
        raise art.UnsupportedOptionError(
            f"init_chat_model(model_provider={model_provider!r}): the trainable model is served "
            "by this backend's OpenAI-compatible endpoint; leave model_provider out (or 'openai')."
        )
    if model is None or isinstance(model, str):
        model = _rollout_model(model)
    return TrainableChatModel(model, **kwargs)


def _rollout_model(name: str | None) -> art.Model:
    """The current rollout's model, checked against the name the caller gave (if any)."""
    scope = current_rollout()
    if scope is None:
        called = "init_chat_model()" if name is None else f"init_chat_model({name!r})"
        raise NoRolloutError(
            f"{called} needs a rollout scope to find its model: call it inside "
            "`async with art_langgraph.rollout(model):` or a `wrap_rollout(model, fn)` function, "
            "or pass the model object itself."
        )
    trainable = scope.trainable_model
    if name is not None and name not in (trainable.name, trainable.get_inference_name()):
        raise ModelNameMismatchError(
            f"init_chat_model({name!r}) inside a rollout of model {trainable.name!r}: the name "
            f"must be the rollout's model ({trainable.name!r} or "
            f"{trainable.get_inference_name()!r}). For another model use a ChatOpenAI of its own."
        )
    return trainable


class ModelNameMismatchError(art.ArtError, ValueError):
    """`init_chat_model("<name>")` named a model other than the current rollout's."""
