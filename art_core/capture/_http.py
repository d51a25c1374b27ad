"""The HTTP side of capture scopes: the patches that tag requests, and the records fetch.

httpx and httpx2 (`Client.send`, `AsyncClient.send`), requests (`Session.send`) and aiohttp
(`ClientSession._request`) are patched once, where each sends a request: a request gets the
header `x-rollout-id` when the resolver given to `install_patches` (the open scope's rollout id
for one of our backends' origins, see `art_core.capture._scopes`) names one, and never when the request
already carries the header. Everything else passes untouched.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from art_core.backend import Backend, _raise_for_status
from art_core.errors import BackendCrashedError

ROLLOUT_HEADER = "x-rollout-id"

# url -> the rollout id its request should carry, or None (set once, by the first install)
_resolve: Callable[[str], str | None] = lambda url: None  # noqa: E731


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # a malformed port: not one of ours
        return scheme, "", None
    return scheme, (parts.hostname or "").lower(), port


# ----------------------------------------------------------------- the patches, installed once

_install_lock = threading.Lock()
_PATCHED = "_art_core_capture"


def install_patches(resolve: Callable[[str], str | None]) -> None:
    """Patch httpx (and httpx2, which openai>=3 uses), requests and aiohttp where installed;
    idempotent and thread-safe. `resolve(url)` names the rollout a request belongs to."""
    global _resolve
    with _install_lock:
        _resolve = resolve
        _patch_httpx(httpx)
        with contextlib.suppress(ImportError):
            import httpx2

            _patch_httpx(httpx2)
        with contextlib.suppress(ImportError):
            _patch_requests()
        with contextlib.suppress(ImportError):
            _patch_aiohttp()


def _patch_httpx(module: Any) -> None:
    """`Client.send` and `AsyncClient.send`: every request of every transport passes there."""
    if getattr(module.Client.send, _PATCHED, False):
        return
    original_send, original_async_send = module.Client.send, module.AsyncClient.send

    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _tag(request.headers, str(request.url))
        return original_send(self, request, *args, **kwargs)

    async def async_send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _tag(request.headers, str(request.url))
        return await original_async_send(self, request, *args, **kwargs)

    setattr(send, _PATCHED, True)
    setattr(async_send, _PATCHED, True)
    module.Client.send = send
    module.AsyncClient.send = async_send


def _tag(headers: Any, url: str) -> None:
    """Add the header to a request's (case-insensitive) headers when `url` is one of ours."""
    if ROLLOUT_HEADER in headers:
        return  # the caller named a rollout itself (art_langgraph does): it wins
    rollout_id = _resolve(url)
    if rollout_id is not None:
        headers[ROLLOUT_HEADER] = rollout_id


def _patch_requests() -> None:
    import requests

    if getattr(requests.Session.send, _PATCHED, False):
        return
    original_send = requests.Session.send

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        _tag(request.headers, str(request.url))  # a redirect comes here too, with its own URL
        return original_send(self, request, **kwargs)

    setattr(send, _PATCHED, True)
    session_class: Any = requests.Session  # assigned through Any: mypy refuses method assignment
    session_class.send = send


def _patch_aiohttp() -> None:
    import aiohttp
    from multidict import CIMultiDict

    if getattr(aiohttp.ClientSession._request, _PATCHED, False):
        return
    original_request = aiohttp.ClientSession._request

    async def request(self: aiohttp.ClientSession, method: str, url: Any, **kwargs: Any) -> Any:
        # A relative URL is resolved against the session's base_url, as aiohttp will.
        build_url = getattr(self, "_build_url", None)
        absolute = str(build_url(url) if build_url is not None else url)
        if ROLLOUT_HEADER not in self.headers:  # the session's own headers apply too
            headers = CIMultiDict(kwargs.get("headers") or {})
            _tag(headers, absolute)
            kwargs["headers"] = headers
        return await original_request(self, method, url, **kwargs)

    setattr(request, _PATCHED, True)
    session_class: Any = aiohttp.ClientSession
    session_class._request = request


# ------------------------------------------------- the records, fetched without an event loop


def get_records_sync(
    backend: Backend, rollout_id: str, method: str = "GET"
) -> list[dict[str, Any]]:
    """`GET` (the records) or `DELETE` (release them) `/v1/rollouts/{id}`, for a `with` block."""
    headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
    url = f"{backend.inference_base_url}/rollouts/{rollout_id}"
    try:
        response = httpx.request(method, url, headers=headers, timeout=30.0)
    except httpx.TransportError as error:
        raise BackendCrashedError(f"The backend at {url} is unreachable: {error}") from error
    _raise_for_status(response)
    return response.json().get("completions", [])
