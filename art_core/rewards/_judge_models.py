"""Which model judges or generates: an `art.Model` as given, a string `"<provider>/<model>"`
resolved from the usual environment variables (`OPENAI_API_KEY`, `OPENROUTER_API_KEY`, ...;
`<PROVIDER>_BASE_URL`, or LiteLLM's `<PROVIDER>_API_BASE`, overrides the URL), or the base model
a backend serves; and the label its answers are cached under.

A string is LiteLLM's model name as ART writes it: `openai/o3`, `anthropic/...` (a bare
`gpt-...`, `o3`, `o4-mini` or `claude-...` is placed as LiteLLM places it, by its family),
`openrouter/...`, and for a server of one's own `hosted_vllm/<model>` (or any provider) with its
URL given (`api_base` in ART's `extra_litellm_params`, or the environment), `ollama/<model>` on
Ollama's OpenAI-compatible port. A hosted provider at its own URL needs its API key; a URL given
by the caller needs none (a local art-server or vLLM may run without one).
"""

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
# A bare model name LiteLLM places by its family, as ART's docs pass them ("gpt-4o-mini").
BARE_NAME_PROVIDERS = (
    ("openai", re.compile(r"^(gpt-|chatgpt-|o[1-9](-|$))")),
    ("anthropic", re.compile(r"^claude-")),
)
# Servers one runs oneself: a default URL where there is a usual one; no API key needed.
LOCAL_PROVIDER_URLS: dict[str, str | None] = {
    "ollama": "http://localhost:11434/v1",
    "ollama_chat": "http://localhost:11434/v1",
    "hosted_vllm": None,
}


def resolve_model(
    spec: Model | str,
    *,
    price: TokenPrice | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
) -> Model:
    """An `art.Model` as is, or `"<provider>/<model>"` resolved from environment variables;
    `base_url` / `api_key` (LiteLLM's `api_base` / `api_key`) point a string at that endpoint."""
    if isinstance(spec, Model):
        if base_url is not None or api_key is not None:
            raise ModelConfigError(
                f"{spec!r} already names its endpoint: an api_base or api_key for the judge "
                "goes with a judge named by a string ('hosted_vllm/<model>'), or into "
                "art.Model(base_url=..., api_key=...)."
            )
        return spec
    if isinstance(spec, str) and "/" not in spec:
        spec = next(
            (f"{p}/{spec}" for p, family in BARE_NAME_PROVIDERS if family.match(spec)), spec
        )
    if not isinstance(spec, str) or "/" not in spec:
        raise ModelConfigError(
            f"A judge or generator is an art.Model or a string '<provider>/<model>' such as "
            f"'openai/gpt-4.1-mini' (a bare name only for OpenAI's and Anthropic's model "
            f"families, as LiteLLM places them); got {spec!r}."
        )
    provider, name = spec.split("/", 1)
    known = provider.lower()
    variable = re.sub(r"[^A-Z0-9]", "_", provider.upper())
    given_url = (
        base_url or os.environ.get(f"{variable}_BASE_URL") or os.environ.get(f"{variable}_API_BASE")
    )
    url = given_url or PROVIDER_URLS.get(known) or LOCAL_PROVIDER_URLS.get(known)
    key = api_key or os.environ.get(f"{variable}_API_KEY")
    if url is None:
        raise ModelConfigError(
            f"Unknown provider {provider!r} in {spec!r}: set {variable}_BASE_URL to its "
            f"OpenAI-compatible URL (and {variable}_API_KEY if it needs one), pass "
            f"extra_litellm_params={{'api_base': ...}} to RULER, or pass "
            f"art.Model(name=..., base_url=..., api_key=...). Known: {', '.join(PROVIDER_URLS)}."
        )
    if not key and not given_url and known in PROVIDER_URLS:
        raise ModelConfigError(f"{spec!r} needs an API key: set {variable}_API_KEY.")
    return Model(name=name, base_url=url, api_key=key, price=price)


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
