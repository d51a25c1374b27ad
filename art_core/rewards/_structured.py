"""Structured calls to a judge or a generator: JSON-schema output, one corrective re-ask, usage.

Every RULER judgement and every scenario batch goes through `structured_completion`:

1. a cache hit (same model, messages, schema and sampling) returns the stored answer: no request;
2. otherwise the model answers under `response_format={"type": "json_schema", ...}` (our backend
   enforces it by constrained decoding, hosted models by their structured outputs);
3. the answer is parsed and validated; if anything is wrong the model is asked once more, told
   exactly what was wrong, and a second bad answer raises `JudgeResponseError`;
4. timeouts, 429 and 5xx are retried with exponential backoff by the openai client itself, then
   raise `JudgeUnavailableError`.

A model can be named by a string, `"<provider>/<model>"`, resolved from the usual environment
variables (`OPENAI_API_KEY`, `OPENROUTER_API_KEY`, ...; `<PROVIDER>_BASE_URL` overrides the URL).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar
from urllib.parse import urlparse

import openai

from art_core.backend import Backend
from art_core.errors import (
    JudgeContextError,
    JudgeError,
    JudgeResponseError,
    JudgeUnavailableError,
    ModelConfigError,
)
from art_core.model import Model
from art_core.rewards._cache import ResponseCache
from art_core.types import TokenPrice

T = TypeVar("T")

# How OpenAI, vLLM, Anthropic and our backend word a prompt longer than the context window.
_CONTEXT_OVERFLOW = re.compile(
    r"context (length|window)|model's context|maximum context|prompt is too long", re.IGNORECASE
)

# Providers with an OpenAI-compatible chat endpoint: default URL; the key is <PROVIDER>_API_KEY.
PROVIDER_URLS = {
    "openai": "https://api.openai.com/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "anthropic": "https://api.anthropic.com/v1/",
    "gemini": "https://generativelanguage.googleapis.com/v1beta/openai/",
    "groq": "https://api.groq.com/openai/v1",
    "together": "https://api.together.xyz/v1",
    "fireworks": "https://api.fireworks.ai/inference/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "mistral": "https://api.mistral.ai/v1",
}


def resolve_model(spec: Model | str, *, price: TokenPrice | None = None) -> Model:
    """An `art.Model` as is, or `"<provider>/<model>"` resolved from environment variables."""
    if isinstance(spec, Model):
        return spec
    if not isinstance(spec, str) or "/" not in spec:
        raise ModelConfigError(
            f"A judge or generator is an art.Model or a string '<provider>/<model>' such as "
            f"'openai/gpt-4.1-mini'; got {spec!r}."
        )
    provider, name = spec.split("/", 1)
    variable = re.sub(r"[^A-Z0-9]", "_", provider.upper())
    base_url = os.environ.get(f"{variable}_BASE_URL") or PROVIDER_URLS.get(provider.lower())
    api_key = os.environ.get(f"{variable}_API_KEY")
    if base_url is None:
        raise ModelConfigError(
            f"Unknown provider {provider!r} in {spec!r}: set {variable}_BASE_URL to its "
            f"OpenAI-compatible URL (and {variable}_API_KEY if it needs one), or pass "
            f"art.Model(name=..., base_url=..., api_key=...). Known: {', '.join(PROVIDER_URLS)}."
        )
    if not api_key and provider.lower() in PROVIDER_URLS:
        raise ModelConfigError(f"{spec!r} needs an API key: set {variable}_API_KEY.")
    return Model(name=name, base_url=base_url, api_key=api_key, price=price)


@dataclass
class JudgeUsage:
    """What judge or generator calls cost: requests, tokens, dollars (when priced), cache hits.

    `truncated_*` count the messages RULER shortened to fit its per-message budget.
    """

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cache_hits: int = 0
    reasks: int = 0
    truncated_messages: int = 0
    truncated_chars: int = 0

    def add(self, other: JudgeUsage) -> None:
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def summary(self) -> str:
        """One line for people: requests, tokens, cache hits, and cost when priced."""
        line = (
            f"{self.requests} requests, {self.prompt_tokens} prompt + {self.completion_tokens} "
            f"completion tokens, {self.cache_hits} cache hits"
        )
        return line + (f", ${self.cost_usd:.4f}" if self.cost_usd else "")

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        """As step metrics (summed over groups by the backend)."""
        return {f"{prefix}{field.name}": float(getattr(self, field.name)) for field in fields(self)}


async def judge_or_base_model(judge: str | None, backend: Backend, base_model: str) -> Model | str:
    """`judge` (`"<provider>/<model>"`) when given; else the base model `backend` serves,
    registered under its own name, so a run works offline (a small model is a weak judge)."""
    if judge:
        return judge
    base = Model(name=base_model)
    await base.register(backend)
    return base


def model_label(model: Model) -> str:
    """What identifies a model's answers in the cache: its served name, and its URL if remote.

    Our own backend listens on a new loopback port every run; its served name (`name@step`)
    already says which weights answered.
    """
    base_url = model.inference_base_url
    host = urlparse(base_url or "").hostname or ""
    local = host in ("127.0.0.1", "localhost", "::1", "")
    name = model.get_inference_name()
    return name if local else f"{base_url}#{name}"


def parse_json_answer(text: str) -> tuple[Any, list[str]]:
    """The JSON in a model's answer (a ``` fence tolerated), or the problems that prevent it."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    duplicates: list[str] = []

    def keep_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    try:
        value = json.loads(body, object_pairs_hook=keep_pairs)
    except ValueError as error:
        return None, [f"it is not valid JSON ({error})"]
    return value, [f'the key "{key}" appears more than once' for key in duplicates]


async def structured_completion(
    model: Model,
    messages: list[dict[str, Any]],
    *,
    schema_name: str,
    schema: dict[str, Any],
    validate: Callable[[Any], tuple[T | None, list[str]]],
    correction: Callable[[list[str]], str],
    usage: JudgeUsage,
    cache: ResponseCache | None = None,
    max_tokens: int | None = None,
    sampling: dict[str, Any] | None = None,
    timeout: float = 600.0,
    max_retries: int = 3,
    keys: list[str] | None = None,
) -> T:
    """Ask `model` for JSON matching `schema`; `validate(parsed)` returns (value, problems).

    `correction(problems)` words the single re-ask. Usage (tokens, cost, cache hits, re-asks)
    is added to `usage`. The request's cache key is appended to `keys` (when given) once the
    answer is used, so a caller can name the very call it relied on (RULER's
    `judge_cache_key`).
    """
    sampling = dict(sampling or {})
    label = model_label(model)
    key = ResponseCache.key(
        {
            "model": label,
            "messages": messages,
            "schema": schema,
            "max_tokens": max_tokens,
            "sampling": sampling,
        }
    )
    if cache is not None and (hit := cache.get(key)) is not None:
        if hit.get("context_overflow"):  # known too long for this judge: no request
            raise JudgeContextError(f"{label}: {hit['context_overflow']} (cached)")
        parsed, hit_problems = parse_json_answer(str(hit.get("answer", "")))
        if not hit_problems:
            value, hit_problems = validate(parsed)
            if not hit_problems:
                usage.cache_hits += 1
                if keys is not None:
                    keys.append(key)
                return value  # type: ignore[return-value]

    client = model.openai_client().with_options(timeout=timeout, max_retries=max_retries)
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": schema_name, "schema": schema, "strict": True},
    }
    conversation = list(messages)
    problems: list[str] = []
    answer = ""
    for attempt in range(2):
        if attempt:
            usage.reasks += 1
            conversation += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": correction(problems)},
            ]
        try:
            answer, finish_reason = await _complete(
                client, model, label, conversation, response_format, max_tokens, sampling, usage
            )
        except JudgeContextError as error:
            if cache is not None and not attempt:
                cache.put(key, {"context_overflow": str(error), "written_at": time.time()})
            raise
        parsed, problems = parse_json_answer(answer)
        if not problems:
            value, problems = validate(parsed)
        if finish_reason == "length":
            limit = f"the {max_tokens}-token limit" if max_tokens else "the token limit"
            problems.insert(0, f"the answer was cut off at {limit}")
        if not problems:
            if cache is not None:
                cache.put(key, {"answer": answer, "model": label, "written_at": time.time()})
            if keys is not None:
                keys.append(key)
            return value  # type: ignore[return-value]
    raise JudgeResponseError(
        f"{label} answered twice without a usable {schema_name}: {'; '.join(problems)}.",
        problems=problems,
        answer=answer,
    )


async def _complete(
    client: openai.AsyncOpenAI,
    model: Model,
    label: str,
    messages: list[dict[str, Any]],
    response_format: dict[str, Any],
    max_tokens: int | None,
    sampling: dict[str, Any],
    usage: JudgeUsage,
) -> tuple[str, str | None]:
    options: dict[str, Any] = dict(sampling)
    if max_tokens is not None:
        options["max_completion_tokens"] = max_tokens
    try:
        response = await client.chat.completions.create(  # type: ignore[call-overload]
            model=model.get_inference_name(),
            messages=messages,
            response_format=response_format,
            **options,
        )
    except (openai.APITimeoutError, openai.APIConnectionError) as error:
        raise JudgeUnavailableError(
            f"{label} did not answer after {client.max_retries + 1} attempts: {error}"
        ) from error
    except (openai.InternalServerError, openai.RateLimitError) as error:
        raise JudgeUnavailableError(
            f"{label} kept failing ({error.status_code}) after {client.max_retries + 1} "
            f"attempts: {error.message}"
        ) from error
    except openai.AuthenticationError as error:
        raise JudgeError(f"{label} rejected the API key (401): {error.message}") from error
    except openai.BadRequestError as error:
        kind = JudgeContextError if _CONTEXT_OVERFLOW.search(str(error.message)) else JudgeError
        raise kind(f"{label} refused the request (400): {error.message}") from error
    except openai.APIStatusError as error:
        raise JudgeError(
            f"{label} refused the request ({error.status_code}): {error.message}"
        ) from error
    usage.requests += 1
    if response.usage is not None:
        usage.prompt_tokens += response.usage.prompt_tokens
        usage.completion_tokens += response.usage.completion_tokens
        if model.price is not None:
            usage.cost_usd += model.price.cost(
                response.usage.prompt_tokens, response.usage.completion_tokens
            )
    if not response.choices:
        return "", None
    choice = response.choices[0]
    text = choice.message.content or ""
    if not text and getattr(choice.message, "refusal", None):
        text = f"(refused: {choice.message.refusal})"
    return text, choice.finish_reason
