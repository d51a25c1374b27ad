"""Secrets never reach a log: key-like query parameters and Authorization values are redacted.

uvicorn's access log prints each request's path with its query string, and a client may send
the key there (`/review/?key=KEY`, the review page's login link, or `?api_key=` from a tool
that expects it), also nested in another value (`?next=/review/%3Fapi_key%3DKEY`:
`carries_secret`, which the review login reads too). `redact_secrets_in_logs()` installs
`RedactSecretsFilter` on the handlers of uvicorn's loggers and of the root logger; call it after
uvicorn configured its logging.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from urllib.parse import parse_qsl, unquote_plus, urlencode

# uvicorn's levels, `--log-level` of both commands; `trace` is uvicorn's own level (5), below debug.
LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]
TRACE_LEVEL = 5


def configure_logging(level: str) -> None:
    """The root logger at `level` (one of LOG_LEVELS), one line per record."""
    logging.basicConfig(
        level=TRACE_LEVEL if level == "trace" else level.upper(),
        format="%(levelname)s %(name)s: %(message)s",
    )
    # httpx logs every request it sends at INFO: the replicas' health probes alone would write
    # a line a second per replica. Its warnings still show; `debug` and `trace` show all.
    if level not in ("debug", "trace"):
        logging.getLogger("httpx").setLevel(logging.WARNING)


REDACTED = "REDACTED"
# Query parameter names (lowercase) whose values are secrets.
SECRET_PARAMS = frozenset(
    {
        "key",
        "api_key",
        "apikey",
        "api-key",
        "token",
        "access_token",
        "auth",
        "authorization",
        "password",
        "secret",
        "session",
    }
)
_SECRET_NAMES = "|".join(re.escape(name) for name in sorted(SECRET_PARAMS, key=len, reverse=True))
# In free text: `key=VALUE` after `?`, `&`, whitespace, a quote (uvicorn's trace level prints
# the ASGI scope: `'query_string': b'key=VALUE'`) or the start; and `Bearer TOKEN`.
_QUERY_SECRET = re.compile(rf"(?i)(^|[?&;\s'\"])({_SECRET_NAMES})=([^&\s\"']*)")
# `NAME=` of a secret anywhere, not as the end of a longer name (`monkey=` is no `key=`).
_SECRET_ASSIGNMENT = re.compile(rf"(?i)(?<![a-z0-9_])(?:{_SECRET_NAMES})=")
# URL-decodings tried; a value still changing after these is an encoding no page of ours makes.
MAX_DECODINGS = 8
_AUTHORIZATION = re.compile(r"(?i)\b(authorization[\"']?\s*[:=]\s*[\"']?)(\w+\s+)?[^\s\"',}]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s\"',}]+")
LOGGERS = ("", "uvicorn", "uvicorn.access", "uvicorn.error")


def redact_path(path: str) -> str:
    """`/review/?key=abc&min_reward=1` -> `/review/?key=REDACTED&min_reward=1`."""
    base, question, query = path.partition("?")
    if not question:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(carries_secret(f"{name}={value}") for name, value in pairs):
        return path
    kept = [
        (name, REDACTED if carries_secret(f"{name}={value}") else value) for name, value in pairs
    ]
    return f"{base}?{urlencode(kept, safe='/')}"


def carries_secret(text: str) -> bool:
    """Whether `text` (a query's `name=value`, a path to go back to) holds `NAME=` of a secret
    (SECRET_PARAMS) at any nesting depth: URL-decoded again (`%253F` -> `%3F` -> `?`) until it
    stops changing; one still changing after MAX_DECODINGS is taken to hold one."""
    for _ in range(MAX_DECODINGS):
        if _SECRET_ASSIGNMENT.search(text):
            return True
        decoded = unquote_plus(text)
        if decoded == text:
            return False
        text = decoded
    return True


def redact_text(text: str) -> str:
    """Key-like query values, Authorization header values and Bearer tokens in free text."""
    text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{m.group(2)}={REDACTED}", text)
    text = _AUTHORIZATION.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{REDACTED}", text)


class RedactSecretsFilter(logging.Filter):
    """Rewrite a record so that it shows no secret; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            # (client, method, path with query, http version, status): the formatter unpacks it.
            client, method, path, version, status = args
            record.args = (client, method, redact_path(str(path)), version, status)
            return True
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redact_secrets_in_logs() -> None:
    """Install the filter on every handler (and logger) that uvicorn's requests can reach."""
    redactor = RedactSecretsFilter()
    for name in LOGGERS:
        logger = logging.getLogger(name)
        targets: list[logging.Filterer] = [logger, *logger.handlers]
        for target in targets:
            if not any(isinstance(f, RedactSecretsFilter) for f in target.filters):
                target.addFilter(redactor)


def run_uvicorn(app: object, **options: object) -> None:
    """`uvicorn.run(app, **options)` with secrets redacted from its logs (it configures them)."""
    import uvicorn

    config = uvicorn.Config(app, **options)  # type: ignore[arg-type]
    redact_secrets_in_logs()
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(3)  # as uvicorn.run: the server could not start (e.g. the port is taken)
