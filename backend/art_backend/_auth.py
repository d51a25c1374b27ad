"""The API key: every route but /health needs it; the review page also takes a browser login.

API clients send `Authorization: Bearer KEY` (or `x-api-key: KEY`, Anthropic's header), on
every route, /review included. A browser cannot, so under /review the key may also be given
once, by the login form (POST
/review/login, shown instead of any review page when the key is missing) or by a link
`/review/?key=KEY` (convenient, but the key then shows in browser history and access logs).
Either sets an HttpOnly cookie scoped to /review that holds a token derived from the key, never
the key itself. SameSite=Lax, not Strict: the review page's GETs only read, so a link from
elsewhere (a chat, an issue) may open it logged in, while a POST from another site carries no
cookie. SameSite is not enough on its own (a page on another port of the same host is the same
"site"), so the forms of a cookie session also carry a CSRF token derived from the key
(`csrf_token`, checked by the review app), and `HostGuardMiddleware` refuses any POST a browser
labels as cross-origin.

Where to go after the login (the login form's `next`, the link's own path and query) and after
a decision is `review_path`: a path of the review page, never another site, and nothing that
carries a secret at any nesting depth (`?next=/review/%3Fapi_key%3DKEY`): the login page would
show it back in its HTML, the redirect in the browser's history.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import html
import os
from urllib.parse import parse_qsl, urlencode

from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from art_backend._errors import TINKER_PREFIX, error_body
from art_backend._log_redaction import carries_secret

REVIEW_PREFIX = "/review"
SESSION_COOKIE = "art_review_session"
MAX_LOGIN_BODY = 16 * 1024


CSRF_STATE = "review_csrf_token"  # request.state's key: set when the request rides on the cookie


def session_token(api_key: str) -> str:
    """The review cookie's value: derived from the key, so the cookie never holds the key."""
    return hmac.new(api_key.encode(), b"art-review-session", hashlib.sha256).hexdigest()


def csrf_token(api_key: str) -> str:
    """The token a cookie session's review forms carry: only a page the server sent knows it."""
    return hmac.new(api_key.encode(), b"art-review-csrf", hashlib.sha256).hexdigest()


class ApiKeyMiddleware:
    """Every route but /health needs `Authorization: Bearer KEY` (or, under /review, the cookie).

    A plain ASGI middleware (not FastAPI's `@app.middleware`): it passes `receive` through
    untouched, so the endpoint still sees the client's disconnect and can cancel its work.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key
        self.token = session_token(api_key)
        self.csrf = csrf_token(api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self._bearer_ok(headers.get("authorization", "")) or self._key_ok(
            headers.get("x-api-key", "")
        ):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == REVIEW_PREFIX or path.startswith(REVIEW_PREFIX + "/"):
            response = await self._review_login(scope, receive, headers)
            if response is None:
                await self.app(scope, receive, send)
                return
        else:
            message = (
                "Missing or invalid API key: give the Tinker SDK the key the server was started "
                "with (TINKER_API_KEY = art-server's --api-key or ART_API_KEY)."
                if path.startswith(TINKER_PREFIX)
                else "Missing or invalid API key: send `Authorization: Bearer <key>` (or "
                "`x-api-key: <key>`, as Anthropic's clients do) with the key the server was "
                "started with (--api-key or ART_API_KEY)."
            )
            body = error_body(
                path, message, error_type="authentication_error", code="invalid_api_key"
            )
            if _anthropic_path(path):  # Anthropic's clients read `{"type": "error", ...}`
                body = {"type": "error", **body}
            response = JSONResponse(body, status_code=401)
        await response(scope, receive, send)

    def _bearer_ok(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        )

    def _key_ok(self, key: str) -> bool:
        return hmac.compare_digest(key.encode(), self.api_key.encode())

    async def _review_login(
        self, scope: Scope, receive: Receive, headers: Headers
    ) -> Response | None:
        """None when the browser is logged in; otherwise the login's answer (cookie or form)."""
        path: str = scope["path"]
        if path == f"{REVIEW_PREFIX}/login" and scope["method"] == "POST":
            form = dict(parse_qsl((await _read_body(receive)).decode("utf-8", "replace")))
            target = review_path(form.get("next", ""))
            if self._key_ok(form.get("key", "")):
                return self._logged_in(target)
            return _login_page(target, "That is not the server's API key.")
        cookie = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.token.encode()):
            # The browser sends the cookie with any request to this site, whoever asked for it:
            # the review app then takes a POST only with the token its own pages carry.
            scope.setdefault("state", {})[CSRF_STATE] = self.csrf
            return None
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        keys = [value for name, value in query if name == "key"]
        # The key, other secret-looking values (`api_key=`, `token=`) and values that nest one
        # (`next=/review/%3Fapi_key%3D...`) are not carried to the page after the login.
        rest = [(name, value) for name, value in query if not carries_secret(f"{name}={value}")]
        target = review_path(path + (f"?{urlencode(rest)}" if rest else ""))
        if keys:
            if self._key_ok(keys[0]):
                return self._logged_in(target)
            return _login_page(target, "That is not the server's API key.")
        return _login_page(target, None)

    def _logged_in(self, target: str) -> Response:
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            SESSION_COOKIE, self.token, httponly=True, samesite="lax", path=REVIEW_PREFIX
        )
        return response


def _anthropic_path(path: str) -> bool:
    """A route of Anthropic's Messages API (plain or rollout-scoped)."""
    return "/v1/messages" in path


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body") or len(body) > MAX_LOGIN_BODY:
            return body[:MAX_LOGIN_BODY]


def review_path(target: str, fallback: str = f"{REVIEW_PREFIX}/") -> str:
    """`target` when it is a path of the review page (not the login) that carries no secret at
    any nesting depth; else `fallback`. No `//`, backslash or control character: a browser reads
    `//host`, `/\\host` and `/\t/host` as another site."""
    path = target.partition("?")[0]
    if (
        (path == REVIEW_PREFIX or path.startswith(f"{REVIEW_PREFIX}/"))
        and not path.startswith(f"{REVIEW_PREFIX}/login")
        and "//" not in target
        and "\\" not in target
        and not any(character.isspace() or not character.isprintable() for character in target)
        and not carries_secret(target)
    ):
        return target
    return fallback


def _login_page(target: str, problem: str | None) -> HTMLResponse:
    message = html.escape(problem) if problem else "This server needs its API key."
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Review: log in</title>
<style>body{{font:15px system-ui,sans-serif;margin:4rem auto;max-width:28rem;color:#222}}
input{{font:inherit;padding:.4rem;width:100%;box-sizing:border-box;margin:.5rem 0}}
button{{font:inherit;padding:.4rem 1rem}}</style></head><body>
<h1>Review page</h1><p role="alert">{message}</p>
<p>Give the key the server was started with (<code>--api-key</code> or
<code>ART_API_KEY</code>). API clients send <code>Authorization: Bearer KEY</code> instead.</p>
<form method="post" action="{REVIEW_PREFIX}/login">
<input type="hidden" name="next" value="{html.escape(target, quote=True)}">
<label>API key <input type="password" name="key" autofocus></label>
<button type="submit">Log in</button></form></body></html>"""
    return HTMLResponse(page, status_code=401)


def add_access_arguments(parser: argparse.ArgumentParser, reached: str) -> None:
    """`--api-key` and `--allowed-hosts`, the same for `art-server` and `art review`."""
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ART_API_KEY"),
        help="require this key (prefer ART_API_KEY: a command line is visible to every local user)",
    )
    parser.add_argument(
        "--allowed-hosts",
        default="",
        metavar="NAMES",
        help=f"host names (comma-separated) a browser may reach the {reached} by, besides "
        "localhost and IP addresses; '*' allows any name (unsafe: DNS rebinding)",
    )
