"""HTTP routes of the training API, under `/v1/training/models/...`.

Long operations (`train`, `sft`) answer with NDJSON events: `review_hold` and
`review_released` (with `config.review_hold_seconds`), `queued` (when other steps are ahead),
`progress`, then one `result` or `error`. Bad requests fail with a 4xx before anything
is queued.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse

from art_backend._limits import CheckedJsonRoute
from art_backend.store._checkpoints import HISTORY_BLOCK_BYTES
from art_backend.training._review_veto import held_for_review
from art_backend.training._training_service import TrainingService
from art_core.wire import (
    DeleteCheckpointsRequest,
    HoldStepRequest,
    LogRequest,
    PromoteRequest,
    RegisterRequest,
    SFTRequest,
    TrainRequest,
)

HISTORY_PIECE_BYTES = HISTORY_BLOCK_BYTES  # a block of the store's history, a piece sent
JSON = "application/json"


def training_router(training: TrainingService) -> APIRouter:
    """The training routes bound to one TrainingService (and its registry and step log)."""
    router = APIRouter(prefix="/v1/training", route_class=CheckedJsonRoute)
    registry, step_log = training.registry, training.step_log

    @router.post("/models")
    async def register(body: RegisterRequest):
        return await registry.register(body)

    @router.get("/models/{project}/{name}")
    async def get_model(project: str, name: str):
        return registry.get(project, name).info()

    @router.get("/models/{project}/{name}/history")
    async def history(project: str, name: str):
        # Read, checked and sent a block of whole lines at a time, each step on a worker thread
        # (Starlette runs a plain iterator's steps there): a long history is tens of megabytes,
        # which one read, split or join would hold the interpreter, so the event loop, to copy.
        store = registry.get(project, name).store
        pieces = store.history_json(HISTORY_PIECE_BYTES)
        if await asyncio.to_thread(_file_size, store.history_path) <= HISTORY_PIECE_BYTES:
            return Response(await asyncio.to_thread(b"".join, pieces), media_type=JSON)
        return StreamingResponse(pieces, media_type=JSON)

    @router.post("/models/{project}/{name}/train")
    async def train(project: str, name: str, body: TrainRequest):
        model = training.validate_train(project, name, body)
        events = training.queued_steps(lambda progress: training.train(model, body, progress))
        if body.config.review_hold_seconds > 0:
            events = held_for_review(model.store, model.step, body, events)
        return _ndjson(events)

    @router.post("/models/{project}/{name}/sft")
    async def train_sft(project: str, name: str, body: SFTRequest):
        model = registry.get(project, name)
        events = training.queued_steps(lambda progress: training.train_sft(model, body, progress))
        return _ndjson(events)

    @router.post("/models/{project}/{name}/log")
    async def log(project: str, name: str, body: LogRequest):
        return await step_log.log(registry.get(project, name), body)

    @router.post("/models/{project}/{name}/promote")
    async def promote(project: str, name: str, body: PromoteRequest):
        return await registry.promote(registry.get(project, name), body)

    @router.post("/models/{project}/{name}/holds")
    async def hold(project: str, name: str, body: HoldStepRequest):
        return await registry.hold(registry.get(project, name), body)

    @router.post("/models/{project}/{name}/delete_checkpoints")
    async def delete_checkpoints(project: str, name: str, body: DeleteCheckpointsRequest):
        return await registry.delete_checkpoints(registry.get(project, name), body)

    return router


def _file_size(path: Path) -> int:
    """The size of the file at `path` in bytes; 0 when there is none."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _ndjson(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        async for event in events:
            yield json.dumps(event) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
