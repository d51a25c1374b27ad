"""The review app: HTML pages to browse a `.art` folder and record reviewers' decisions.

Mounted at `/review` by `art-server` (behind its API key) and served alone by `art review`.
GET pages read the store; two POST routes append decisions (flag, override, withdraw, approve)
to the model's `review/decisions.jsonl`, with their `source` (the page, or `langfuse` when the
client's Langfuse read-back posts them); `GET .../pending` lists held steps as JSON for it. Errors are HTML pages (JSON for `Accept:
application/json`) with the status: 404 naming what exists, 400 naming the field.

Who may post: the app is served behind `HostGuardMiddleware` (a browser's cross-origin POST is
refused before it gets here) and, with a key, `ApiKeyMiddleware`; a request that rides on the
key login's cookie must also carry the CSRF token the pages put in every form (403 otherwise).
"""

from __future__ import annotations

import hmac
import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from art_backend._auth import CSRF_STATE
from art_backend._errors import (
    BackendError,
    CrossSiteRequestError,
    InvalidRequestError,
    StoreNotFoundError,
)
from art_backend._unicode import TolerantHTMLResponse, TolerantJSONResponse
from art_backend.review._browse import (
    PENDING,
    StepView,
    list_models,
    list_steps,
    load_state,
    load_step,
    open_model,
)
from art_backend.review._diff import filter_examples, load_step_diff
from art_backend.review._diff_page import DiffQuery, diff_page
from art_backend.review._filters import TrajectoryFilter
from art_backend.review._html import CSRF_FIELD, PREFIX, Reviewer, Urls
from art_backend.review._pages import (
    SEARCH_LIMIT,
    error_page,
    group_page,
    index_page,
    model_page,
    search_page,
    step_page,
    trajectory_page,
)
from art_backend.store._checkpoints import ModelStore
from art_backend.store._review_decisions import (
    SOURCES,
    append_decision,
    list_pending,
    read_decisions,
    read_pending,
    review_state,
)

WHO_COOKIE = "art_review_who"
MAX_REASON = 2000
MAX_FORM_BYTES = 64 * 1024
TRAJECTORY_ACTIONS = {
    "flag_trajectory": "flag_trajectory",
    "override_reward": "override_reward",
    "withdraw_trajectory": "withdraw",
}
GROUP_ACTIONS = {"flag_group": "flag_group", "withdraw_group": "withdraw"}


def create_review_app(root: Path) -> FastAPI:
    """The review pages over the store at `root` (a server's --path), to mount at /review."""
    app = FastAPI(
        title="review",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        default_response_class=TolerantJSONResponse,
    )

    def reviewer(request: Request) -> Reviewer:
        token = getattr(request.state, CSRF_STATE, "")
        return Reviewer(request.cookies.get(WHO_COOKIE, ""), token)

    @app.get("/", response_class=TolerantHTMLResponse)
    def models() -> str:
        return index_page(root, list_models(root))

    @app.get("/login")
    @app.post("/login")
    def login_without_key() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=303)  # no --api-key: nothing to log in to

    @app.get("/{project}/{name}", response_class=TolerantHTMLResponse)
    @app.get("/{project}/{name}/", response_class=TolerantHTMLResponse)
    def model(project: str, name: str, request: Request) -> str:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        extra = set(query) - {"metrics"}
        if extra or query.get("metrics", "all") != "all":
            raise InvalidRequestError(
                "This page takes only `metrics=all` (plot every step metric).", param="metrics"
            )
        decisions = read_decisions(store.dir)
        return model_page(
            store,
            list_steps(store),
            store.read_history(),
            list_pending(store.dir),
            review_state(decisions).approved,
            decisions,
            all_metrics="metrics" in query,
            reviewer=reviewer(request),
        )

    @app.get("/{project}/{name}/search", response_class=TolerantHTMLResponse)
    def search(project: str, name: str, request: Request) -> str:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        wanted = TrajectoryFilter.from_query(query)
        state = load_state(store)
        steps = list_steps(store)
        results: list[tuple[str, str, Any]] = []
        damaged: list[str] = []  # steps whose file is damaged: searched as far as readable
        for entry in steps:
            if wanted.split and entry.split != wanted.split:
                continue
            view = load_step(store, entry.split, str(entry.step), state)
            if view.damage:
                damaged.append(f"{entry.split} step {entry.step}")
            for group in wanted.apply(view.groups):
                results += [(entry.split, str(entry.step), t) for t in group.trajectories]
            if len(results) > SEARCH_LIMIT:
                break
        splits = sorted({entry.split for entry in steps})
        return search_page(
            store,
            results[:SEARCH_LIMIT],
            query,
            splits,
            truncated=len(results) > SEARCH_LIMIT,
            damaged=damaged,
        )

    @app.get("/{project}/{name}/diff", response_model=None)
    def diff(project: str, name: str, request: Request) -> Response:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        wanted = DiffQuery.parse(query)
        wants_json = "application/json" in request.headers.get("accept", "")
        if wanted.from_step is None or wanted.to_step is None:
            if wants_json:
                raise InvalidRequestError(
                    "Give `from` and `to`: the two steps to compare.", param="from"
                )
            result, shown = None, []
        else:
            result = load_step_diff(
                store, wanted.split, wanted.from_step, wanted.to_step, wanted.options
            )
            shown = filter_examples(result, wanted.tag, wanted.text)
            if wants_json:
                return TolerantJSONResponse(result.to_json(shown))
        steps_by_split: dict[str, list[int]] = {}
        for split_name, number, _ in store.trajectory_files():
            steps_by_split.setdefault(split_name, []).append(number)
        html = diff_page(store, query, wanted, steps_by_split, result, shown)
        return TolerantHTMLResponse(html)

    @app.get("/{project}/{name}/steps/{split}/{step}", response_class=TolerantHTMLResponse)
    def step(project: str, name: str, split: str, step: str, request: Request) -> str:
        store = open_model(root, project, name)
        query = dict(request.query_params)
        wanted = TrajectoryFilter.from_query(query)
        state = load_state(store)
        view = load_step(store, split, step, state)
        shown = wanted.apply(view.groups) if wanted.active else view.groups
        return step_page(store, view, shown, query, state.approved, reviewer(request))

    @app.get(
        "/{project}/{name}/steps/{split}/{step}/groups/{group}", response_class=TolerantHTMLResponse
    )
    def group(project: str, name: str, split: str, step: str, group: str, request: Request) -> str:
        store = open_model(root, project, name)
        view = load_step(store, split, step, load_state(store))
        return group_page(store, view, view.group(group), reviewer(request))

    @app.get(
        "/{project}/{name}/steps/{split}/{step}/trajectories/{trajectory_id:path}",
        response_class=TolerantHTMLResponse,
    )
    def trajectory(
        project: str, name: str, split: str, step: str, trajectory_id: str, request: Request
    ) -> str:
        store = open_model(root, project, name)
        view = load_step(store, split, step, load_state(store))
        return trajectory_page(store, view, view.trajectory(trajectory_id), reviewer(request))

    @app.post("/{project}/{name}/steps/{split}/{step}/decisions")
    async def decide(project: str, name: str, split: str, step: str, request: Request) -> Response:
        form = await _form(request)
        store = await run_in_threadpool(open_model, root, project, name)
        decision, target = await run_in_threadpool(_decision, store, split, step, form)
        row = await run_in_threadpool(append_decision, store.dir, decision)
        return _done(request, row, form.get("next") or target)

    @app.get("/{project}/{name}/pending")
    def held_steps(project: str, name: str) -> dict[str, Any]:
        """The steps held for review now, with their trajectory ids (what the client matches)."""
        store = open_model(root, project, name)
        held = []
        for pending in list_pending(store.dir):
            if (found := read_pending(store.dir, pending.id)) is not None:
                ids = [row["id"] for row in found[1] if "id" in row]
                held.append({**pending.to_json(), "trajectory_ids": ids})
        return {"pending": held}

    @app.post("/{project}/{name}/pending/{pending_id}/approve")
    async def approve(project: str, name: str, pending_id: str, request: Request) -> Response:
        form = await _form(request)
        store = await run_in_threadpool(open_model, root, project, name)
        pending = await run_in_threadpool(read_pending, store.dir, pending_id)
        if pending is None:
            raise _not_held(store, pending_id)
        held, _ = pending
        decision = {
            "action": "approve",
            "pending": pending_id,
            "who": _who(form),
            "source": _source(form),
            "where": {"split": PENDING, "step": pending_id, "sampled_at": held.step},
        }
        row = await run_in_threadpool(append_decision, store.dir, decision)
        # Back to the model's page: the held step leaves the pending list once it has trained.
        return _done(request, row, form.get("next") or Urls(project, name).model)

    _register_error_pages(app)
    return app


def _decision(
    store: ModelStore, split: str, step: str, form: dict[str, str]
) -> tuple[dict[str, Any], str]:
    """The decision row a form asks for, validated against the step; and the page to go back to."""
    action = form.get("action", "")
    if action not in TRAJECTORY_ACTIONS and action not in GROUP_ACTIONS:
        choices = ", ".join([*TRAJECTORY_ACTIONS, *GROUP_ACTIONS])
        raise InvalidRequestError(
            f"Unknown action {action!r}: use one of {choices}.", param="action"
        )
    reason = form.get("reason", "").strip()
    if not reason:
        raise InvalidRequestError(
            "A reason is required: say why, so that whoever reads the decision log later knows.",
            param="reason",
        )
    if len(reason) > MAX_REASON:
        raise InvalidRequestError(
            f"The reason is {len(reason)} characters long: keep it under {MAX_REASON}.",
            param="reason",
        )
    view = load_step(store, split, step, load_state(store))
    urls = Urls(store.project, store.name)
    decision: dict[str, Any] = {"reason": reason, "who": _who(form), "source": _source(form)}
    if action in TRAJECTORY_ACTIONS:
        trajectory = view.trajectory(form.get("trajectory_id", ""))
        decision.update(action=TRAJECTORY_ACTIONS[action], trajectory_id=trajectory.id)
        decision["where"] = _where(view, trajectory.group)
        if action == "override_reward":
            decision["reward"] = _reward(form.get("reward", ""))
        return decision, urls.trajectory(view.split, view.step, trajectory.id)
    group = view.group(form.get("group", ""))
    if not group.trajectories:
        raise InvalidRequestError(
            f"Group {group.index} has no trajectories (only exceptions): nothing to flag.",
            param="group",
        )
    decision.update(action=GROUP_ACTIONS[action], trajectory_ids=group.member_ids)
    decision["where"] = _where(view, group.index)
    return decision, urls.group(view.split, view.step, group.index)


def _where(view: StepView, group: int) -> dict[str, Any]:
    """Where a decision was made; a held step also records the step its rollouts train from."""
    where: dict[str, Any] = {"split": view.split, "step": view.step, "group": group}
    if view.pending is not None:
        where["sampled_at"] = view.pending.step
    return where


def _reward(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise InvalidRequestError(
            f"The reward must be a number, got {text!r}.", param="reward"
        ) from None
    if not math.isfinite(value):
        raise InvalidRequestError(
            f"The reward must be a finite number, got {text!r}: GRPO cannot compare it.",
            param="reward",
        )
    return value


def _who(form: dict[str, str]) -> str | None:
    return form.get("who", "").strip()[:100] or None


def _source(form: dict[str, str]) -> str:
    source = form.get("source", "page")
    if source not in SOURCES:
        raise InvalidRequestError(
            f"Unknown source {source!r}: use one of {', '.join(SOURCES)}.", param="source"
        )
    return source


def _not_held(store: ModelStore, pending_id: str) -> BackendError:
    return StoreNotFoundError(
        f"No step {pending_id!r} is held for review on {store.project}/{store.name}: it was "
        "already trained, its hold expired, or it never existed."
    )


async def _form(request: Request) -> dict[str, str]:
    """The posted form; refused when it rides on the login cookie without the pages' token."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise InvalidRequestError(f"The form is over {MAX_FORM_BYTES} bytes.")
    try:
        form = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except UnicodeDecodeError as error:
        raise InvalidRequestError(f"The form is not valid UTF-8: {error}") from error
    # Set by ApiKeyMiddleware when the cookie (not the Authorization header) let the request in:
    # the browser would send that cookie with a form another page made it post, too.
    expected = getattr(request.state, CSRF_STATE, None)
    if expected is not None:
        given = form.pop(CSRF_FIELD, "")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise CrossSiteRequestError(
                "This form does not carry the review page's token "
                f"({'missing' if not given else 'wrong'} `{CSRF_FIELD}`): it was not posted from "
                "the review page, or the page is older than the server's key. Reload the page "
                "and post again; API clients send `Authorization: Bearer KEY` instead of the "
                "cookie."
            )
    return form


def _done(request: Request, row: dict[str, Any], target: str) -> Response:
    """JSON for API clients; for a browser, back to the page (303) remembering the name."""
    if "application/json" in request.headers.get("accept", ""):
        return TolerantJSONResponse({"decision": row})
    if not target.startswith(f"{PREFIX}/") or "//" in target or "\\" in target:
        target = f"{PREFIX}/"
    response = RedirectResponse(target, status_code=303)
    if row.get("who"):
        response.set_cookie(WHO_COOKIE, row["who"], httponly=True, samesite="lax", path=PREFIX)
    return response


def _register_error_pages(app: FastAPI) -> None:
    def answer(
        request: Request, status: int, message: str, param: str | None, kind: str | None = None
    ) -> Response:
        if "application/json" in request.headers.get("accept", ""):
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
