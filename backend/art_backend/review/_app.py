"""The review app: HTML pages to browse a `.art` folder and record reviewers' decisions.

Mounted at `/review` by `art-server` (behind its API key) and served alone by `art review`.
GET pages read the store (`_page_routes`); two POST routes append decisions (flag, override,
withdraw, approve) to the model's `review/decisions.jsonl`, with their `source` (the page, or
`langfuse` when the client's Langfuse read-back posts them); `GET .../pending` lists held steps
as JSON for it (`_decision_routes`). Errors are HTML pages (JSON for `Accept:
application/json` or `format=json`, as `wants_json` reads them) with the status: 404 naming what exists, 400 naming the field.

Who may post: the app is served behind `HostGuardMiddleware` (a browser's cross-origin POST is
refused before it gets here) and, with a key, `ApiKeyMiddleware`; a request that rides on the
key login's cookie must also carry the CSRF token the pages put in every form (403 otherwise).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from art_backend._errors import BackendError
from art_backend._unicode import TolerantHTMLResponse, TolerantJSONResponse, tolerant_app
from art_backend.review._browse import list_models
from art_backend.review._decision_routes import add_decision_routes, wants_json
from art_backend.review._html import PREFIX
from art_backend.review._page_routes import add_model_pages, add_step_pages
from art_backend.review._pages import error_page, index_page


def create_review_app(root: Path) -> FastAPI:
    """The review pages over the store at `root` (a server's --path), to mount at /review: the
    index here, each page's routes attached by its own function."""
    app = tolerant_app("review", openapi_url=None)

    @app.get("/", response_class=TolerantHTMLResponse)
    def models() -> str:
        return index_page(root, list_models(root))

    @app.get("/login")
    @app.post("/login")
    def login_without_key() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=303)  # no --api-key: nothing to log in to

    add_model_pages(app, root)
    add_step_pages(app, root)
    add_decision_routes(app, root)
    _register_error_pages(app)
    return app


def _register_error_pages(app: FastAPI) -> None:
    def answer(
        request: Request, status: int, message: str, param: str | None, kind: str | None = None
    ) -> Response:
        if wants_json(request):
            kind = kind or ("not_found_error" if status == 404 else "invalid_request_error")
            body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
            return TolerantJSONResponse(body, status_code=status)
        return TolerantHTMLResponse(error_page(status, message), status_code=status)

    @app.exception_handler(BackendError)
    async def backend_error(request: Request, error: BackendError) -> Response:
        return answer(request, error.status_code, error.message, error.param, error.error_type)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        message = (
            f"No review page at {request.url.path}: start from {PREFIX}/."
            if error.status_code == 404
            else str(error.detail)
        )
        return answer(request, error.status_code, message, None)
