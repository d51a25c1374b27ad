"""The routes of the Tinker API's REST calls (the SDK's `RestClient`), under /api/v1:

    GET    training_runs, training_runs/{id}, training_runs/{id}/checkpoints, checkpoints
    POST   weights_info
    DELETE training_runs/{id}/checkpoints/{kind}/{name}
    POST   training_runs/{id}/checkpoints/{kind}/{name}/publish   (DELETE: unpublish)
    PUT    training_runs/{id}/checkpoints/{kind}/{name}/ttl
    GET    sessions, sessions/{id}

`{kind}/{name}` is a checkpoint id (`weights/<name>`, `sampler_weights/<name>`). What they mean
is `_checkpoints`' and `_sessions`'; every checkpoint route first deletes what has expired
(`TinkerCheckpoints.expire_due`), so an expired checkpoint is never listed nor found.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from art_backend._errors import InvalidRequestError
from art_backend._limits import parse_json_object
from art_backend.tinker._checkpoints import TinkerCheckpoints
from art_backend.tinker._schemas import CheckpointTtlRequest, WeightsInfoRequest
from art_backend.tinker._sessions import TinkerSessions

REST_SERVED = (
    "training_runs, training_runs/{id}, training_runs/{id}/checkpoints (GET, and DELETE, "
    "publish, ttl of one), checkpoints, weights_info, sessions, sessions/{id}"
)


def _page(limit: int, offset: int) -> None:
    if limit < 1 or offset < 0:
        raise InvalidRequestError(
            "limit must be at least 1 and offset at least 0.",
            param="limit" if limit < 1 else "offset",
        )


async def _body(request: Request) -> dict[str, Any]:
    """A small JSON body through the server's one door (its bounds)."""
    return parse_json_object(await request.body() or b"{}")


def attach_rest_routes(
    router: APIRouter, checkpoints: TinkerCheckpoints, sessions: TinkerSessions
) -> None:
    """Add the RestClient's routes to the Tinker API's `router`."""
    _attach_listings(router, checkpoints)
    _attach_checkpoint_changes(router, checkpoints)
    _attach_sessions(router, sessions)


def _attach_listings(router: APIRouter, checkpoints: TinkerCheckpoints) -> None:
    @router.get("/training_runs")
    async def training_runs(limit: int = 20, offset: int = 0) -> Any:
        _page(limit, offset)
        await checkpoints.expire_due()
        return checkpoints.training_runs(limit, offset)

    @router.get("/training_runs/{model_id}")
    async def training_run(model_id: str) -> Any:
        await checkpoints.expire_due()
        return checkpoints.training_run(model_id)

    @router.get("/training_runs/{model_id}/checkpoints")
    async def run_checkpoints(model_id: str) -> Any:
        await checkpoints.expire_due()
        return {"checkpoints": checkpoints.checkpoints(model_id)}

    @router.get("/checkpoints")
    async def user_checkpoints(limit: int = 100, offset: int = 0) -> Any:
        _page(limit, offset)
        await checkpoints.expire_due()
        return checkpoints.user_checkpoints(limit, offset)

    @router.post("/weights_info")
    async def weights_info(request: Request) -> Any:
        body = WeightsInfoRequest.model_validate(await _body(request))
        await checkpoints.expire_due()
        return checkpoints.weights_info(body.tinker_path)


def _attach_checkpoint_changes(router: APIRouter, checkpoints: TinkerCheckpoints) -> None:
    one = "/training_runs/{model_id}/checkpoints/{kind}/{name}"

    @router.delete(one)
    async def delete_checkpoint(model_id: str, kind: str, name: str) -> Any:
        await checkpoints.expire_due()
        await checkpoints.delete(model_id, f"{kind}/{name}")
        return None

    @router.post(f"{one}/publish")
    async def publish(model_id: str, kind: str, name: str) -> Any:
        await checkpoints.expire_due()
        checkpoints.publish(model_id, f"{kind}/{name}", public=True)
        return None

    @router.delete(f"{one}/publish")
    async def unpublish(model_id: str, kind: str, name: str) -> Any:
        await checkpoints.expire_due()
        checkpoints.publish(model_id, f"{kind}/{name}", public=False)
        return None

    @router.put(f"{one}/ttl")
    async def set_ttl(model_id: str, kind: str, name: str, request: Request) -> Any:
        body = CheckpointTtlRequest.model_validate(await _body(request))
        await checkpoints.expire_due()
        checkpoints.set_ttl(model_id, f"{kind}/{name}", body.ttl_seconds)
        return None


def _attach_sessions(router: APIRouter, sessions: TinkerSessions) -> None:
    @router.get("/sessions")
    async def list_sessions(limit: int = 20, offset: int = 0) -> Any:
        _page(limit, offset)
        return sessions.sessions(limit, offset)

    @router.get("/sessions/{session_id}")
    async def get_session(session_id: str) -> Any:
        return sessions.session(session_id)
