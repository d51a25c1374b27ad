"""Structured calls to a judge or a generator: JSON-schema output, one corrective re-ask, usage.

Every RULER judgement and every scenario batch goes through `structured_completion`:

1. a cache hit (same model, messages, schema and sampling) returns the stored answer: no request;
2. otherwise the model answers under `response_format={"type": "json_schema", ...}` (our backend
   enforces it by constrained decoding, hosted models by their structured outputs);
3. the answer is parsed and validated; if anything is wrong the model is asked once more, told
   exactly what was wrong, and a second bad answer raises `JudgeResponseError`;
4. timeouts, 429 and 5xx are retried with exponential backoff by the openai client itself, then
   raise `JudgeUnavailableError`.

Which model answers is `_judge_models.py`'s; what the calls cost is counted in a `JudgeUsage`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai

from art_core.errors import JudgeContextError, JudgeError, JudgeResponseError, JudgeUnavailableError
from art_core.model import Model
from art_core.rewards._cache import ResponseCache
from art_core.rewards._judge_models import model_label
from art_core.rewards._judge_usage import JudgeUsage

T = TypeVar("T")

# How OpenAI, vLLM, Anthropic and our backend word a prompt longer than the context window.
_CONTEXT_OVERFLOW = re.compile(
    r"context (length|window)|model's context|maximum context|prompt is too long", re.IGNORECASE
)


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
    request = {"messages": messages, "schema": schema, "max_tokens": max_tokens}
    key = ResponseCache.key({"model": label, **request, "sampling": sampling})
    if cache is not None and (hit := cache.get(key)) is not None:
        cached, usable = _cached_answer(hit, label, validate)
        if usable:
            usage.cache_hits += 1
            if keys is not None:
                keys.append(key)
            return cached  # type: ignore[return-value]

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


def _cached_answer(
    hit: dict[str, Any], label: str, validate: Callable[[Any], tuple[T | None, list[str]]]
) -> tuple[T | None, bool]:
    """A cached answer's value, and whether it is usable; a prompt the cache knows is too long
    for this judge raises `JudgeContextError` without a request."""
    if hit.get("context_overflow"):
        raise JudgeContextError(f"{label}: {hit['context_overflow']} (cached)")
    parsed, problems = parse_json_answer(str(hit.get("answer", "")))
    if problems:
        return None, False
    value, problems = validate(parsed)
    return value, not problems


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
