"""How RULER calls its judge (`JudgeCall`): our keywords, and ART's `extra_litellm_params`,
LiteLLM's names for the same settings.

    LiteLLM's name                                    here
    api_base, base_url / api_key                      the judge's endpoint (`resolve_model`)
    temperature, top_p, stop, seed, presence_penalty,
    frequency_penalty, logit_bias, reasoning_effort,
    user, service_tier, verbosity                     the request, as sent   (`sampling=`)
    top_k, min_p, repetition_penalty                  the request's extra body (vLLM's, ours)
    extra_headers, extra_body                         the request, as the openai client sends them
    max_tokens, max_completion_tokens                 `max_tokens=`
    timeout, request_timeout / num_retries,
    max_retries                                       `timeout=` / `max_retries=`

Any other name cannot be honoured here (there is no LiteLLM underneath): it is named in one
`IgnoredSettingWarning`, with the reason where there is one. One setting given both ways (say
`max_tokens=` and `extra_litellm_params={"max_tokens": ...}`) with two values is an error. A
judge scores greedily (temperature 0) unless told otherwise, a sampled score being noise; OpenAI's
reasoning models (o1, o3, o4-mini, gpt-5), which refuse any temperature but 1, are sent none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from art_core._caller_warnings import warn_at_caller
from art_core.errors import IgnoredSettingWarning, UnsupportedOptionError
from art_core.model import Model
from art_core.rewards._judge_models import resolve_model

DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_RETRIES = 3

_ENDPOINT = {"api_base": "base_url", "base_url": "base_url", "api_key": "api_key"}
_REQUEST = {
    "temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty",
    "logit_bias", "reasoning_effort", "user", "service_tier", "verbosity", "extra_headers",
}  # fmt: skip
_EXTRA_BODY = {"top_k", "min_p", "repetition_penalty"}
_CALL = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "timeout": "timeout",
    "request_timeout": "timeout",
    "num_retries": "max_retries",
    "max_retries": "max_retries",
}
# Why some LiteLLM parameters have no meaning for a RULER judgement; any other unknown name is
# "not a setting of this judge client".
_WHY_IGNORED = {
    "n": "RULER reads one answer",
    "stream": "RULER reads one whole answer",
    "response_format": "RULER asks for its own JSON schema",
    "tools": "the judge answers with JSON, not tool calls",
    "tool_choice": "the judge answers with JSON, not tool calls",
    "caching": "RULER caches answers on disk itself (cache=)",
    "metadata": "it is for LiteLLM's callbacks",
    "mock_response": "the judge is always asked for real",
    "fallbacks": "LiteLLM's router is not used",
    "drop_params": "no parameter is dropped silently here",
    "api_version": "Azure's deployments are not supported; name the endpoint with api_base",
    "custom_llm_provider": "the provider is the prefix of the judge's name",
}
# OpenAI's reasoning models refuse a temperature other than 1: they get none.
_NO_TEMPERATURE = re.compile(r"(^|/)(o\d|gpt-5)")


@dataclass
class JudgeCall:
    """The judge and how each request to it is made."""

    model: Model
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES


def judge_call(
    judge: Model | str,
    extra_litellm_params: Mapping[str, Any] | None,
    *,
    sampling: Mapping[str, Any] | None = None,
    max_tokens: int | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
) -> JudgeCall:
    """The call for `judge`: our keywords and ART's `extra_litellm_params` together."""
    params = dict(extra_litellm_params or {})
    if "api_base" in params and "base_url" in params:
        raise UnsupportedOptionError(
            "extra_litellm_params: api_base and base_url are one setting (the judge's URL): "
            "pass one."
        )
    endpoint = {_ENDPOINT[name]: params.pop(name) for name in list(params) if name in _ENDPOINT}
    request: dict[str, Any] = dict(sampling or {})
    extra_body = {name: params.pop(name) for name in _EXTRA_BODY if name in params}
    if extra_body or "extra_body" in params:
        body = {**dict(params.pop("extra_body", None) or {}), **extra_body}
        _merge(request, {"extra_body": body})
    _merge(request, {name: params.pop(name) for name in list(params) if name in _REQUEST})
    ours = {"max_tokens": max_tokens, "timeout": timeout, "max_retries": max_retries}
    settings: dict[str, Any] = {key: value for key, value in ours.items() if value is not None}
    _merge(settings, {_CALL[name]: params.pop(name) for name in list(params) if name in _CALL})
    if params:
        _warn_ignored(params)
    model = resolve_model(judge, **endpoint)
    if "temperature" not in request and not _NO_TEMPERATURE.search(model.name):
        request["temperature"] = 0.0
    return JudgeCall(
        model=model,
        sampling=request,
        max_tokens=settings.get("max_tokens"),
        timeout=settings.get("timeout", DEFAULT_TIMEOUT),
        max_retries=settings.get("max_retries", DEFAULT_MAX_RETRIES),
    )


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    """`more` added to `into`; a setting given twice with two values is an error."""
    for name, value in more.items():
        if name in into and into[name] != value:
            raise UnsupportedOptionError(
                f"RULER's {name} is given twice, as {into[name]!r} and as {value!r} (in "
                f"extra_litellm_params, LiteLLM's names for the same settings): pass one."
            )
        into[name] = value


def _warn_ignored(params: Mapping[str, Any]) -> None:
    """One warning naming every parameter not honoured, at the caller's line outside art_core."""
    reasons = [
        f"{name} ({_WHY_IGNORED.get(name, 'not a setting of this judge client')})"
        for name in params
    ]
    warn_at_caller(
        f"RULER ignores extra_litellm_params {', '.join(reasons)}: the judge is called through "
        "its OpenAI-compatible API, without LiteLLM.",
        IgnoredSettingWarning,
    )
