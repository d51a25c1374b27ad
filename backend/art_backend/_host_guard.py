"""Browsers may drive the server only from its own pages: the Host allow-list and the origin rule.

A loopback bind does not stop a web page: the user's own browser makes the request. Two attacks,
with or without --api-key (a key stops neither on its own when there is none, and the review
page's cookie rides along with any request the browser makes to the server's site):

- DNS rebinding: a page on evil.example re-resolves its own name to 127.0.0.1 and then reads and
  writes the server as if same-origin; the browser still sends `Host: evil.example:8000`. Only
  Host names this server knows are answered (400 otherwise): localhost names (`localhost`,
  `*.localhost`), IP literals (a rebinding page always has a name; an IP in Host means the page
  came from that address itself), the name given to --host, and --allowed-hosts (`*`: any
  name, which gives the protection up).
- Cross-site requests: any page can POST a form or a `text/plain` fetch (no CORS preflight) to
  http://127.0.0.1:8000/v1/chat/completions. Browsers label every POST with `Origin` and
  `Sec-Fetch-Site`; a state-changing request (POST, PUT, PATCH, DELETE) that they label as
  coming from another origin is refused (403). Same origin means the same scheme, host and port
  as the request itself (its scheme, its Host): a page on another port or scheme of the same
  address (a dev server on 127.0.0.1:3000, a notebook) is another origin, even when that address
  is --host or listed in --allowed-hosts, which only decide which Host names are answered.
  Behind a TLS proxy the request's scheme is https when the proxy says so (X-Forwarded-Proto,
  which uvicorn trusts from 127.0.0.1). `Origin: null` (a sandboxed frame, a file:// page) is
  another origin too. Clients that are not browsers (openai, httpx, LangChain) send neither
  header and are not affected.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from art_backend._errors import error_body

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOCAL_NAMES = frozenset({"localhost"})
ANY_HOST = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_allowed_hosts(text: str | None) -> list[str]:
    """`--allowed-hosts a.example,b.example:8000` as host names (ports dropped, lowercase)."""
    hosts = []
    for item in (text or "").split(","):
        item = item.strip()
        if item == ANY_HOST:
            hosts.append(ANY_HOST)
        elif item:
            hosts.append(hostname(item))
    return hosts


def allowed_hosts(bound_host: str, flag: str | None) -> list[str]:
    """`--host` and `--allowed-hosts`: the name the server was bound by is one it answers to
    (0.0.0.0, :: are not names), besides those it is told."""
    return [*parse_allowed_hosts(bound_host), *parse_allowed_hosts(flag)]


def hostname(netloc: str) -> str:
    """The host of `host`, `host:port`, `[v6]:port` or a bare IPv6 address; lowercase."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc[1:]
    if netloc.count(":") == 1:
        netloc = netloc.split(":")[0]
    return netloc.rstrip(".")


class HostGuardMiddleware:
    """Answer only known Host names; refuse state-changing requests a browser says are cross-origin.

    A plain ASGI middleware (like `ApiKeyMiddleware`): it passes `receive` through untouched, so
    the endpoint still sees the client's disconnect and can cancel its work.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        listed = {hostname(host) if host != ANY_HOST else ANY_HOST for host in allowed_hosts}
        self.any_host = ANY_HOST in listed
        self.listed = listed - {ANY_HOST}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and not self._host_allowed(hostname(host)):
            response = _refusal(
                scope["path"],
                400,
                "invalid_request_error",
                "host_not_allowed",
                f"This server does not answer to the host name {hostname(host)!r} (a web page can "
                "reach a local server through a name it controls: DNS rebinding). Use "
                "http://localhost or the server's address, or start the server with "
                f"--allowed-hosts {hostname(host)} if that name is yours.",
            )
        elif scope["method"] in STATE_CHANGING and (
            problem := _cross_origin(headers, host, scope.get("scheme", "http"))
        ):
            response = _refusal(
                scope["path"], 403, "permission_error", "cross_origin_request", problem
            )
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)

    def _host_allowed(self, name: str) -> bool:
        return (
            self.any_host
            or name in LOCAL_NAMES
            or name.endswith(".localhost")
            or name in self.listed
            or _is_ip_literal(name)
        )


def _cross_origin(headers: Headers, host: str | None, scheme: str) -> str | None:
    """Why a browser's state-changing request comes from another origin; None if it does not."""
    origin = headers.get("origin")
    site = headers.get("sec-fetch-site", "").lower()
    advice = (
        "the server takes such requests only from its own pages and from clients that are "
        "not browsers (no Origin header). A page on another site, or on another port or scheme "
        "of this host, cannot drive it, with or without an API key."
    )
    if origin is not None:
        if origin.strip().lower() == "null":
            return (
                "This request came from another site: a page with no origin of its own "
                f"(Origin: null: a sandboxed frame or a local file). {advice}"
            )
        if not _same_origin(origin, host, scheme):
            return f"This request came from another origin (Origin: {origin}): {advice}"
        return None
    if site in ("cross-site", "same-site"):
        return f"This request came from another site (Sec-Fetch-Site: {site}): {advice}"
    return None


def _same_origin(origin: str, host: str | None, scheme: str) -> bool:
    """Origin has the request's own scheme, Host name and port (the scheme's default if none)."""
    parts = urlsplit(origin.strip())
    if parts.scheme != scheme or scheme not in DEFAULT_PORTS or not parts.netloc or host is None:
        return False
    try:
        origin_port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        return False
    host_port = _port(host) or DEFAULT_PORTS[scheme]
    return hostname(parts.netloc) == hostname(host) and origin_port == host_port


def _port(netloc: str) -> int | None:
    tail = netloc.rsplit("]", 1)[-1] if netloc.startswith("[") else netloc
    if tail.count(":") != 1:
        return None
    digits = tail.rsplit(":", 1)[1]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _refusal(path: str, status: int, error_type: str, code: str, message: str) -> JSONResponse:
    body = error_body(path, message, error_type=error_type, code=code)
    return JSONResponse(body, status_code=status)
