"""The review app's decisions: the two POST routes that append them, and the held steps' list.

`POST .../steps/<split>/<step>/decisions` flags, overrides or withdraws (a trajectory or a
group); `POST .../pending/<id>/approve` approves a held step. Each appends one row to the
model's `review/decisions.jsonl` with its `source` (the page, or `langfuse` when the client's
Langfuse read-back posts it); `GET .../pending` lists the held steps as JSON for that read-back.

A form that rides on the key login's cookie must carry the CSRF token the pages put in every
form (403 otherwise); a browser is sent back to the page (303), an API client gets JSON.
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

from art_backend._auth import CSRF_STATE, review_path
from art_backend._errors import (
    BackendError,
    CrossSiteRequestError,
    InvalidRequestError,
    StoreNotFoundError,
)
from art_backend._unicode import TolerantJSONResponse
from art_backend.review._browse import PENDING, StepView, load_state, load_step, open_model
from art_backend.review._html import CSRF_FIELD, PREFIX, Reviewer, Urls
from art_backend.store._checkpoints import ModelStore
from art_backend.store._review_decisions import (
    SOURCES,
    append_decision,
    list_pending,
    read_pending,
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


def add_decision_routes(app: FastAPI, root: Path) -> None:
    """Attach the decision routes over the store at `root`."""

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


def wants_json(request: Request) -> bool:
    """Whether the client asked for JSON (errors included): `format=json` in the query (a link
    can carry it), else `Accept: application/json`; `format=html` asks for the page."""
    asked = request.query_params.get("format")
    if asked in ("json", "html"):
        return asked == "json"
    return "application/json" in request.headers.get("accept", "")


def reviewer(request: Request) -> Reviewer:
    """Who fills the pages' forms: the name their last decision gave (a cookie), and the token."""
    token = getattr(request.state, CSRF_STATE, "")
    return Reviewer(request.cookies.get(WHO_COOKIE, ""), token)


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
    """JSON for API clients; for a browser, back to the page (303, the index unless
    `review_path` takes `target`) remembering the name."""
    if wants_json(request):
        return TolerantJSONResponse({"decision": row})
    response = RedirectResponse(review_path(target), status_code=303)
    if row.get("who"):
        response.set_cookie(WHO_COOKIE, row["who"], httponly=True, samesite="lax", path=PREFIX)
    return response
