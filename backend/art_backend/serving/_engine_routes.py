"""The engine routes (/v1/engine/...): this server's engine lent to another art-server, which
routes its rollouts here as one of its engine replicas (`art-server --replica-api`; the wire is
`engines._engine_wire`).

The request meets the bounds every route meets: `SamplingParams` checks its own fields, the
prompt is token ids inside the vocabulary and, with `max_new_tokens`, inside the context, at
most `MAX_CHOICES` choices; a grammar compiles in the chat service's grammar lane, as a chat
request's does. Nothing is recorded here: the server in front records what its clients asked.
An adapter arrives as a tar archive, is written under `--path`/replica-adapters/<name>, loaded,
and its previous copy removed; an unload removes its folder.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from art_backend._errors import (
    ContextLengthError,
    InvalidRequestError,
    NotFoundError,
)
from art_backend._limits import CheckedJsonRoute
from art_backend.engines._engine import FinishEvent, GenerationRequest
from art_backend.engines._engine_wire import (
    ENGINE_PATH,
    NDJSON,
    TAR,
    event_line,
    unpack_adapter,
    vocabulary_fingerprint,
)
from art_backend.serving._models_routes import check_adapter_name
from art_backend.serving._request import LogitBias, StopSequences, stop_list
from art_backend.serving._sampling_params import sampling_params
from art_backend.serving.chat._service import ChatService
from art_backend.serving.completions._schemas import MAX_CHOICES, TokenIds
from art_core.names import ROLLOUT_ID_PATTERN
from art_core.wire import SEED_RANGE

MAX_TOP_LOGPROBS = 20  # as the Completions route's `logprobs`
REPLICA_ADAPTERS = "replica-adapters"
BINARY = {"type": "string", "format": "binary"}


class EngineParams(BaseModel):
    """`SamplingParams` as the wire carries them (the engine checks them again itself)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: StrictInt = Field(ge=1)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: StrictInt = Field(default=0, ge=0)
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: StopSequences = None
    seed: StrictInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: LogitBias = None
    top_logprobs: StrictInt = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    grammar: str | None = None

    @property
    def stop_list(self) -> list[str]:
        return stop_list(self.stop)


class EngineGenerateRequest(BaseModel):
    """POST /v1/engine/generate: a `GenerationRequest` (`_engine_wire.request_body`)."""

    model_config = ConfigDict(extra="forbid")

    prompt_ids: TokenIds
    n: StrictInt = Field(default=1, ge=1, le=MAX_CHOICES)
    adapter: str | None = None
    stream_tokens: StrictBool = True
    session: str | None = Field(default=None, pattern=ROLLOUT_ID_PATTERN.pattern)
    params: EngineParams


def attach_engine_routes(app: FastAPI, service: ChatService, art_path: Path) -> None:
    """Add /v1/engine, /v1/engine/generate and /v1/engine/adapters/{name} to `app`."""
    router = APIRouter()
    engine = service.engine
    fingerprint: list[str] = []  # computed on first use (a large vocabulary takes a moment)

    async def describe():
        if not fingerprint:
            fingerprint.append(await asyncio.to_thread(vocabulary_fingerprint, engine.tokenizer))
        return {
            "object": "engine",
            "engine": engine.name,
            "vocab_size": engine.vocab_size,
            "vocabulary": fingerprint[0],
            "context_length": engine.context_length,
            "adapters": sorted(engine.adapters),
        }

    async def generate(body: EngineGenerateRequest):
        generation = await _generation(service, body)
        events = engine.submit(generation)
        return StreamingResponse(_stream(generation, events), media_type=NDJSON)

    async def load_adapter(name: str, request: Request):
        check_adapter_name(name)
        if request.headers.get("content-type", "").split(";")[0].strip() != TAR:
            raise InvalidRequestError(
                "Send the adapter as a tar archive (Content-Type: application/x-tar).",
                param="body",
            )
        archive = await request.body()
        root = art_path / REPLICA_ADAPTERS
        folder = root / f"{name}.{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(unpack_adapter, archive, folder)
        try:
            await asyncio.to_thread(engine.load_adapter, name, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        await asyncio.to_thread(_remove_other_copies, root, name, folder)
        return {"id": name, "object": "model"}

    async def unload_adapter(name: str):
        check_adapter_name(name)
        if name not in engine.adapters:
            raise NotFoundError(f"Adapter {name!r} is not loaded here.", param="name")
        await asyncio.to_thread(engine.unload_adapter, name)
        await asyncio.to_thread(_remove_other_copies, art_path / REPLICA_ADAPTERS, name, None)
        return {"id": name, "object": "model", "deleted": True}

    router.add_api_route(ENGINE_PATH, describe, methods=["GET"])
    router.add_api_route(
        f"{ENGINE_PATH}/generate",
        generate,
        methods=["POST"],
        route_class_override=CheckedJsonRoute,
    )
    router.add_api_route(
        f"{ENGINE_PATH}/adapters/{{name}}",
        load_adapter,
        methods=["PUT"],
        openapi_extra={"requestBody": {"required": True, "content": {TAR: {"schema": BINARY}}}},
    )
    router.add_api_route(f"{ENGINE_PATH}/adapters/{{name}}", unload_adapter, methods=["DELETE"])
    app.include_router(router)


async def _generation(service: ChatService, body: EngineGenerateRequest) -> GenerationRequest:
    """The request the engine runs, bounded like every route's (see the module doc)."""
    engine = service.engine
    prompt, wanted = body.prompt_ids, body.params.max_new_tokens
    outside = next((token for token in prompt if token >= engine.vocab_size), None)
    if outside is not None:
        raise InvalidRequestError(
            f"prompt_ids holds token {outside}, outside the vocabulary [0, {engine.vocab_size}).",
            param="prompt_ids",
        )
    if len(prompt) + wanted > engine.context_length:
        raise ContextLengthError(
            f"This model's maximum context length is {engine.context_length} tokens; the prompt "
            f"has {len(prompt)} and max_new_tokens is {wanted}. Lower max_new_tokens or shorten "
            "the prompt.",
            param="params.max_new_tokens",
        )
    if body.adapter is not None and body.adapter not in engine.adapters:
        raise NotFoundError(
            f"Adapter {body.adapter!r} is not loaded here; PUT it to "
            f"{ENGINE_PATH}/adapters/{body.adapter} first.",
            param="adapter",
        )
    params = body.params
    sampling = sampling_params(
        params, engine.vocab_size, max_new_tokens=wanted, top_logprobs=params.top_logprobs
    )
    generation = GenerationRequest(
        prompt_ids=list(prompt),
        params=sampling,
        n=body.n,
        adapter=body.adapter,
        stream_tokens=body.stream_tokens,
        session=body.session,
    )
    if params.grammar is not None:
        compile_text = partial(service.grammar_compiler.from_text, params.grammar)
        service.constrain(generation, await service.grammars.compile(compile_text))
    return generation


async def _stream(generation: GenerationRequest, events: asyncio.Queue) -> AsyncIterator[bytes]:
    """The request's events, a line each, until every choice finished; a client that leaves
    (the connection closes) cancels the rows still decoding."""
    open_choices = generation.n
    try:
        while open_choices:
            event = await events.get()
            if isinstance(event, FinishEvent):
                open_choices -= 1
            yield event_line(event)
    finally:
        if open_choices:
            generation.cancel()


def _remove_other_copies(root: Path, name: str, keep: Path | None) -> None:
    """Every folder of `name` under `root` but `keep` (the one loaded now)."""
    for folder in root.glob(f"{name}.*"):
        if folder != keep and folder.name.rsplit(".", 1)[0] == name:
            shutil.rmtree(folder, ignore_errors=True)
