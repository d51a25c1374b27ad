"""Which model judges or generates: an `art.Model` as given, a string `"<provider>/<model>"`
resolved from the usual environment variables (`OPENAI_API_KEY`, `OPENROUTER_API_KEY`, ...;
`<PROVIDER>_BASE_URL` overrides the URL), or the base model a backend serves; and the label its
answers are cached under."""

from __future__ import annotations

import os
import re
from urllib.parse import urlparse

from art_core.backend import Backend
from art_core.errors import ModelConfigError
from art_core.model import Model
from art_core.types import TokenPrice

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


def resolve_model(
    spec: Model | str, *, price: TokenPrice | None = None, api_key: str | None = None
) -> Model:
    """An `art.Model` as is, or `"<provider>/<model>"` resolved from environment variables
    (`api_key`, when given, instead of `<PROVIDER>_API_KEY`)."""
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
    api_key = api_key or os.environ.get(f"{variable}_API_KEY")
    if base_url is None:
        raise ModelConfigError(
            f"Unknown provider {provider!r} in {spec!r}: set {variable}_BASE_URL to its "
            f"OpenAI-compatible URL (and {variable}_API_KEY if it needs one), or pass "
            f"art.Model(name=..., base_url=..., api_key=...). Known: {', '.join(PROVIDER_URLS)}."
        )
    if not api_key and provider.lower() in PROVIDER_URLS:
        raise ModelConfigError(f"{spec!r} needs an API key: set {variable}_API_KEY.")
    return Model(name=name, base_url=base_url, api_key=api_key, price=price)


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
