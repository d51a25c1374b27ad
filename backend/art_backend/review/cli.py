"""`art review`: the review page alone, over a `.art` folder, without loading any model.

    art review --path .art --port 8080 [--host 127.0.0.1] [--api-key KEY] [--allowed-hosts NAMES]

Reads what `art-server` wrote (history, trajectories, held steps) and appends reviewers'
decisions next to them; a running `art-server` on the same folder honours them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from art_backend._auth import add_access_arguments
from art_backend._log_redaction import LOG_LEVELS

if TYPE_CHECKING:
    from fastapi import FastAPI


def build_review_server(
    art_path: Path, *, api_key: str | None = None, allowed_hosts: list[str] | None = None
) -> FastAPI:
    """An app that serves only /review (and /health) over `art_path`.

    `allowed_hosts`: host names a browser may reach it by besides localhost and IP addresses.
    """
    from fastapi import FastAPI
    from fastapi.responses import RedirectResponse

    from art_backend._auth import ApiKeyMiddleware
    from art_backend._host_guard import HostGuardMiddleware
    from art_backend.review._app import create_review_app

    app = FastAPI(title="art review", docs_url=None, redoc_url=None, openapi_url=None)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    # Added last, so it runs first: a page on another site is refused before anything else.
    app.add_middleware(HostGuardMiddleware, allowed_hosts=allowed_hosts or [])

    @app.get("/")
    def root():
        return RedirectResponse("/review/")

    @app.get("/health")
    def health():
        return {"status": "ok"}

    app.mount("/review", create_review_app(art_path))
    return app


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and serve the review page until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="art review", description=__doc__)
    parser.add_argument("--path", default=".art", type=Path, help="the folder art-server wrote")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    add_access_arguments(parser, reached="page")
    parser.add_argument("--log-level", default="warning", choices=LOG_LEVELS)
    args = parser.parse_args(argv)
    if not args.path.is_dir():
        parser.exit(
            2,
            f"art review: error: no folder {str(args.path)!r}: give --path the folder art-server "
            "used as its --path (default .art).\n",
        )

    from art_backend._host_guard import allowed_hosts
    from art_backend._log_redaction import configure_logging, run_uvicorn

    configure_logging(args.log_level)
    hosts = allowed_hosts(args.host, args.allowed_hosts)
    app = build_review_server(args.path, api_key=args.api_key, allowed_hosts=hosts)
    login = " (log in with the API key)" if args.api_key else ""
    print(f"art review: http://{args.host}:{args.port}/review/ over {args.path}{login}", flush=True)
    run_uvicorn(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
