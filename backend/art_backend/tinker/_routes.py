"""The routes of the Tinker API under /api/v1, as the `tinker` 0.38 SDK calls them.

Served (what `ServiceClient`, `TrainingClient` and `SamplingClient` need to start, train with
the losses of `_losses.LOSSES`, save sampler weights and sample):

    GET  healthz, get_server_capabilities, samplers/{id}
    POST client/config, client/dynamic_config, telemetry (accepted, dropped)
    POST create_session, session_heartbeat, sessions/{id}/finish
    POST create_model, get_info, forward_backward (protobuf), optim_step,
         save_weights, load_weights (`_states`), save_weights_for_sampler,
         create_sampling_session, asample, retrieve_future
    RestClient's calls: training runs, checkpoints, sessions (`_rest_routes`)

Every other /api/v1 route is refused with 404, naming it and what is served. Errors take the
SDK's shape, `{"detail": message}` (the SDK raises `BadRequestError`, `NotFoundError`, ... with
it): the app's error handlers answer every /api/v1 error so (`_app`), and the body-size
middleware its 413; a failed operation answers through its future (`_futures`). The API key is
the server's `--api-key`, sent by the SDK as `X-API-Key` (its TINKER_API_KEY; the SDK wants it
to start with `tml-`).

Bodies take the door every other route takes: JSON through `_limits.parse_json_object`, then
the route's schema (`parsed`), protobuf through the bounded decoder (`_proto_decode`), each off
the event loop when large (`_limits.parse_off_loop`). A refused operation of a training run
still takes its `seq_id` turn, wherever it is refused (`parsed`, the decoder, `once`), so the
run's later operations are not held.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from art_backend._errors import (
    TINKER_PREFIX,
    BackendError,
    InvalidRequestError,
    MalformedProtobufError,
    NotFoundError,
    RouteNotServedError,
)
from art_backend._limits import parse_json_object, parse_off_loop
from art_backend.engines._engine import Engine
from art_backend.tinker._checkpoints import TinkerCheckpoints
from art_backend.tinker._futures import Answer
from art_backend.tinker._proto_decode import decode_forward_backward, request_turn
from art_backend.tinker._rest_routes import REST_SERVED, attach_rest_routes
from art_backend.tinker._sampling import TinkerSampling
from art_backend.tinker._schemas import (
    CreateModelRequest,
    CreateSamplingSessionRequest,
    CreateSessionRequest,
    FutureRetrieveRequest,
    GetInfoRequest,
    LoadWeightsRequest,
    OptimStepRequest,
    SampleRequest,
    SaveWeightsForSamplerRequest,
    SaveWeightsRequest,
    SessionHeartbeatRequest,
)
from art_backend.tinker._service import TinkerTraining
from art_backend.tinker._sessions import TinkerSessions
from art_backend.tinker._states import TinkerStates
from art_backend.training._training_service import TrainingService

PROTOBUF = "application/x-protobuf"
SERVED = (
    "healthz, get_server_capabilities, client/config, client/dynamic_config, telemetry, "
    "create_session, session_heartbeat, sessions/{id}/finish, create_model, get_info, "
    "forward_backward (forward too), optim_step, save_weights, load_weights, "
    "save_weights_for_sampler, "
    f"create_sampling_session, samplers/{{id}}, asample, retrieve_future, {REST_SERVED}"
)
Parsed = TypeVar("Parsed", bound=BaseModel)
# A protobuf body is decoded in Python (about a microsecond a field, where `json.loads` is C):
# past this size, on a worker thread, so 16 KiB of the smallest fields costs the loop ~6 ms.
DECODE_ON_LOOP_MAX_BYTES = 16 * 1024


async def parsed(
    request: Request, schema: type[Parsed], tinker: TinkerTraining | None = None
) -> Parsed:
    """The request's JSON body through the server's one door (`parse_json_object`: its size,
    value, depth, integer and surrogate bounds; off the event loop when large), then as
    `schema`. With `tinker`, a body the schema refuses that still names a run and a seq_id
    takes that operation's turn (`skip_turn`), so the run's later operations are not held."""
    payload, outcome = await parse_off_loop(
        await request.body() or b"{}", functools.partial(_validated, schema=schema)
    )
    if isinstance(outcome, ValidationError):
        if tinker is not None:
            tinker.skip_turn(*_turn_named(payload))
        raise outcome
    return outcome


def _validated(
    body: bytes, schema: type[Parsed]
) -> tuple[dict[str, Any], Parsed | ValidationError]:
    """The body parsed, and as `schema` or why not: both on one thread, off the loop when the
    body is large (parsing and validating `MAX_JSON_VALUES` values takes about 0.2 s)."""
    payload = parse_json_object(body)
    try:
        return payload, schema.model_validate(payload)
    except ValidationError as error:
        return payload, error


def _turn_named(payload: dict[str, Any]) -> tuple[str | None, int | None]:
    """The run and seq_id a refused body names, where they have the right types."""
    model_id, seq_id = payload.get("model_id"), payload.get("seq_id")
    return (
        model_id if isinstance(model_id, str) else None,
        seq_id if isinstance(seq_id, int) and not isinstance(seq_id, bool) else None,
    )


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def future(request_id: str, model_id: str | None = None) -> dict[str, Any]:
    """The SDK's UntypedAPIFuture: what it polls with retrieve_future."""
    return {"request_id": request_id, "model_id": model_id}


async def once(
    tinker: TinkerTraining,
    request: Request,
    model_id: str | None,
    seq_id: int | None,
    start: Callable[[], str],
) -> dict[str, Any]:
    """The future of a training run's operation: started once per seq_id (an SDK retry gets the
    first one's request id). A refused operation still takes its turn (`skip_turn`), so the
    run's later operations are not held."""
    # A retry is known by its body's hash: a large body is hashed off the event loop.
    digest = await parse_off_loop(await request.body(), _sha256)
    request_id = tinker.repeated(model_id, seq_id, digest)
    if request_id is None:
        try:
            request_id = start()
        except Exception:  # refused (a BackendError, a settings check): the turn is taken
            tinker.skip_turn(model_id, seq_id)
            raise
        tinker.remember(model_id, seq_id, digest, request_id)
    return future(request_id, model_id)


def attach_tinker_routes(
    app: FastAPI, engine: Engine, base_names: list[str], training: TrainingService
) -> None:
    """Add the Tinker API's routes (/api/v1/...) over `engine` and `training` to `app`."""
    tinker = TinkerTraining(engine, base_names, training)
    app.state.tinker = tinker  # its runs, by model id (tests look inside)
    sampling = TinkerSampling(tinker)
    sessions = TinkerSessions(tinker.index)
    # Not in /openapi.json: the SDK's own types describe these routes (`_schemas`, `_proto`).
    router = APIRouter(prefix=TINKER_PREFIX.rstrip("/"), include_in_schema=False)
    _attach_session_routes(router, tinker, sessions)
    _attach_training_routes(router, tinker, sampling)
    states = TinkerStates(tinker)
    _attach_state_routes(router, states)
    _attach_sampling_routes(router, sampling, sessions)
    checkpoints = app.state.tinker_checkpoints = TinkerCheckpoints(tinker, states)
    attach_rest_routes(router, checkpoints, sessions)

    @router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_served(rest: str) -> Any:
        raise RouteNotServedError(
            f"The Tinker API's {TINKER_PREFIX}{rest} is not served by this server yet. It serves: "
            f"{SERVED}."
        )

    app.include_router(router)


def _attach_session_routes(
    router: APIRouter, tinker: TinkerTraining, sessions: TinkerSessions
) -> None:
    @router.get("/healthz")
    async def healthz() -> Any:
        return {"status": "ok"}

    @router.get("/get_server_capabilities")
    async def capabilities() -> Any:
        context = tinker.engine.context_length
        models = [
            {
                "model_name": name,
                "max_context_length": context,
                "trainable": True,
                "sampleable": True,
            }
            for name in tinker.base_names
        ]
        return {"supported_models": models}

    @router.post("/client/config")
    async def client_config() -> Any:
        # API keys as they are (no JWT exchange), httpx's own transport, JSON and plain
        # protobuf bodies, one retrieve_future per request.
        return {"pjwt_auth_enabled": False, "use_pyqwest_transport": False}

    @router.post("/client/dynamic_config")
    async def dynamic_config() -> Any:
        return {}

    @router.post("/telemetry")
    async def telemetry() -> Any:
        return {"status": "accepted"}

    @router.post("/create_session")
    async def create_session(request: Request) -> Any:
        body = await parsed(request, CreateSessionRequest)
        session_id = sessions.create(body.user_metadata)
        return {"type": "create_session", "session_id": session_id}

    @router.post("/session_heartbeat")
    async def session_heartbeat(request: Request) -> Any:
        await parsed(request, SessionHeartbeatRequest)
        return {"type": "session_heartbeat"}

    @router.post("/sessions/{session_id}/finish")
    async def finish_session(session_id: str) -> Any:
        return None


def _attach_training_routes(
    router: APIRouter, tinker: TinkerTraining, sampling: TinkerSampling
) -> None:
    @router.post("/create_model")
    async def create_model(request: Request) -> Any:
        return future(tinker.create_model(await parsed(request, CreateModelRequest)))

    @router.post("/get_info")
    async def get_info(request: Request) -> Any:
        return tinker.info((await parsed(request, GetInfoRequest)).model_id)

    @router.post("/forward_backward")
    async def forward_backward(request: Request) -> Any:
        if request.headers.get("content-encoding"):
            raise InvalidRequestError("Send forward_backward uncompressed (no Content-Encoding).")
        if PROTOBUF not in request.headers.get("content-type", ""):
            raise InvalidRequestError(f"forward_backward takes a protobuf body ({PROTOBUF}).")
        body = await request.body()
        try:
            wire = await parse_off_loop(
                body, decode_forward_backward, on_loop_max_bytes=DECODE_ON_LOOP_MAX_BYTES
            )
        except MalformedProtobufError:
            turn = await parse_off_loop(
                body, request_turn, on_loop_max_bytes=DECODE_ON_LOOP_MAX_BYTES
            )
            tinker.skip_turn(*turn)
            raise
        seq_id = wire.seq_id or None
        try:  # the datums' checks and layout: off the loop for a large request
            prepare = functools.partial(tinker.prepare_forward_backward, wire)
            prepared = (
                await asyncio.to_thread(prepare)
                if len(body) > DECODE_ON_LOOP_MAX_BYTES
                else prepare()
            )
        except BackendError:
            tinker.skip_turn(wire.model_id, seq_id)
            raise
        start = functools.partial(tinker.forward_backward, prepared)
        return await once(tinker, request, wire.model_id, seq_id, start)

    _add_ordered_operation(router, tinker, "/optim_step", OptimStepRequest, tinker.optim_step)
    _add_ordered_operation(
        router,
        tinker,
        "/save_weights_for_sampler",
        SaveWeightsForSamplerRequest,
        sampling.save_weights_for_sampler,
    )

    @router.post("/retrieve_future")
    async def retrieve_future(request: Request) -> Any:
        body = await parsed(request, FutureRetrieveRequest)
        try:
            outcome = await tinker.futures.retrieve(body.request_id)
        except KeyError:
            raise NotFoundError(
                f"No operation {body.request_id!r} on this server (unknown, or long forgotten)."
            ) from None
        if outcome is None:
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        if not isinstance(outcome, Answer):
            return outcome  # the failure: {"error", "category"}
        if outcome.proto is not None:
            return Response(outcome.proto, media_type=PROTOBUF)
        return outcome.body


def _attach_state_routes(router: APIRouter, states: TinkerStates) -> None:
    tinker = states.training

    _add_ordered_operation(router, tinker, "/save_weights", SaveWeightsRequest, states.save)

    @router.post("/load_weights")
    async def load_weights(request: Request) -> Any:
        body = await parsed(request, LoadWeightsRequest, tinker)
        if body.session_id is not None:  # a new training run
            request_id, model_id = states.load(body)
            return future(request_id, model_id)

        def start() -> str:
            return states.load(body)[0]

        return await once(tinker, request, body.model_id, body.seq_id, start)


def _attach_sampling_routes(
    router: APIRouter, sampling: TinkerSampling, sessions: TinkerSessions
) -> None:
    @router.post("/create_sampling_session")
    async def create_sampling_session(request: Request) -> Any:
        body = await parsed(request, CreateSamplingSessionRequest)
        answer = await sampling.create_session(body)
        sessions.add_sampler(body.session_id, answer["sampling_session_id"])
        return answer

    @router.get("/samplers/{sampler_id}")
    async def describe_sampler(sampler_id: str) -> Any:
        return sampling.describe(sampler_id)

    @router.post("/asample")
    async def asample(request: Request) -> Any:
        return await sampling.sample(await parsed(request, SampleRequest))


def _add_ordered_operation(
    router: APIRouter,
    tinker: TinkerTraining,
    path: str,
    schema: type[Any],
    start: Callable[[Any], str],
) -> None:
    """POST `path`: its JSON body as `schema`, run as `start(body)` in the model's `seq_id`
    order (`once`: a retry with the same body gets the first future)."""

    async def operation(request: Request) -> Any:
        body = await parsed(request, schema, tinker)
        return await once(
            tinker, request, body.model_id, body.seq_id, functools.partial(start, body)
        )

    operation.__name__ = path.strip("/")
    router.post(path)(operation)
