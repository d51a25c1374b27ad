"""The HTTP app: routes grouped by resource, errors mapped to OpenAI's shape in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import psutil
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from art_backend._auth import ApiKeyMiddleware
from art_backend._errors import BackendError, InvalidNameError, InvalidRequestError
from art_backend._host_guard import HostGuardMiddleware
from art_backend._limits import (
    DEFAULT_MAX_BODY_MB,
    MIB,
    BodySizeLimitMiddleware,
    CheckedJsonRoute,
    parse_json_object,
)
from art_backend._openapi import describe_api
from art_backend._unicode import TolerantJSONResponse
from art_backend.engines._adapter_files import ADAPTER_CONFIG, ADAPTER_SAFETENSORS
from art_backend.review._app import create_review_app
from art_backend.serving._chat import ChatService
from art_backend.serving._responses import ResponsesService
from art_backend.serving._schemas import (
    ChatCompletionRequest,
    LoadAdapterRequest,
    LookupCompletionsRequest,
)
from art_backend.store._records import validate_rollout_id
from art_backend.training._routes import training_router
from art_backend.training._service import TrainingService
from art_core.names import is_adapter_name

logger = logging.getLogger("art_backend.app")

DISCONNECT_POLL_SECONDS = 0.5
PARSE_ON_LOOP_MAX_BYTES = 256 * 1024  # larger chat bodies are parsed on a worker thread


RequestT = TypeVar("RequestT")


def create_app(
    service: ChatService,
    *,
    api_key: str | None = None,
    art_path: Path | None = None,
    training: TrainingService | None = None,
    allowed_hosts: list[str] | None = None,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
) -> FastAPI:
    """Build the FastAPI app around a started engine's chat service.

    `allowed_hosts`: host names a browser may reach it by besides localhost and IP addresses.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn has drained in-flight requests by now (SIGTERM); let the engine finish too.
        service.engine.stop()

    app = FastAPI(
        title="art-server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        default_response_class=TolerantJSONResponse,
    )
    app.state.service = service
    app.state.training = training

    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=int(max_body_mb * MIB))
    # Added last, so it runs first: a page on another site is refused before anything else.
    app.add_middleware(HostGuardMiddleware, allowed_hosts=allowed_hosts or [])
    _register_error_handlers(app)

    # ----------------------------------------------------------------------------- completions

    async def chat_completions(raw: Request, rollout_id: str | None = None):
        return await _answer(raw, rollout_id, _parse_chat_request, service.stream, service.complete)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(raw: Request):
        return await chat_completions(raw)

    @app.post("/rollouts/{rollout_id}/v1/chat/completions")
    async def create_rollout_chat_completion(rollout_id: str, raw: Request):
        return await chat_completions(raw, rollout_id)

    @app.post("/v1/chat/completions/lookup")
    async def lookup_chat_completions(body: LookupCompletionsRequest):
        # One request for many records: the Langfuse exporter reads a step's calls with it.
        records = service.records.get_many(body.ids)
        found = {record["id"] for record in records}
        return await _encoded_off_loop(
            {
                "object": "list",
                "data": records if body.tokens else [_without_tokens(r) for r in records],
                "missing": [i for i in body.ids if i not in found],
            }
        )

    @app.get("/v1/chat/completions/{completion_id}")
    async def get_chat_completion(completion_id: str):
        record = service.records.get(completion_id)
        if record is None:
            return _error(
                404,
                "not_found_error",
                f"No completion {completion_id!r}: it was never served here, or it was evicted "
                "(see the eviction rule in the README; evictions are counted on /metrics).",
            )
        return await _encoded_off_loop(record)

    @app.get("/v1/rollouts/{rollout_id}")
    async def get_rollout(rollout_id: str):
        validate_rollout_id(rollout_id)
        records = service.records.rollout(rollout_id)
        return await _encoded_off_loop(
            {"object": "rollout", "id": rollout_id, "completions": records}
        )

    @app.delete("/v1/rollouts/{rollout_id}")
    async def discard_rollout(rollout_id: str):
        # A rollout that failed is not trained: its records are released now, not in an hour.
        validate_rollout_id(rollout_id)
        discarded = service.records.discard_rollout(rollout_id)
        return {"object": "rollout.deleted", "id": rollout_id, "discarded": len(discarded)}

    # ------------------------------------------------------------------------------- responses

    # The Responses API, translated onto chat completions (records, tools, engines unchanged).
    responses = app.state.responses = ResponsesService(service)

    async def create_response(raw: Request, rollout_id: str | None = None):
        return await _answer(raw, rollout_id, responses.parse, responses.stream, responses.create)

    @app.post("/v1/responses")
    async def create_plain_response(raw: Request):
        return await create_response(raw)

    @app.post("/rollouts/{rollout_id}/v1/responses")
    async def create_rollout_response(rollout_id: str, raw: Request):
        return await create_response(raw, rollout_id)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return responses.get(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return responses.delete(response_id)

    # ---------------------------------------------------------------------------------- models

    async def list_models():
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "art"}
                for name in service.served_models()
            ],
        }

    app.get("/v1/models")(list_models)
    app.get("/rollouts/{rollout_id}/v1/models")(list_models)

    async def load_adapter(body: LoadAdapterRequest):
        if not is_adapter_name(body.name):
            raise InvalidNameError(
                f"Invalid adapter name {body.name!r}: use `<name>@<step>` with letters, digits, "
                "'.', '_' or '-' in the name.",
                param="name",
            )
        root = (art_path or Path(".art")).resolve()
        try:
            # A NUL byte or an over-long name raises here rather than naming a missing folder.
            path = Path(body.path).resolve()
            found = path.is_relative_to(root) and (path / "adapter_config.json").is_file()
        except (ValueError, OSError) as error:
            raise InvalidRequestError(
                f"Adapter path {body.path!r} is not a usable path: {error}.", param="path"
            ) from error
        if not path.is_relative_to(root):
            raise InvalidNameError(
                f"Adapter path {body.path!r} is outside the server's --path {str(root)!r}.",
                param="path",
            )
        if not found:
            raise InvalidRequestError(
                f"No PEFT adapter at {body.path!r} (adapter_config.json missing).", param="path"
            )
        # The folder is inside --path; the files PEFT reads must be too (not links out of it).
        for name in (ADAPTER_CONFIG, ADAPTER_SAFETENSORS):
            if not (path / name).resolve().is_relative_to(root):
                raise InvalidNameError(
                    f"Adapter file {name} in {body.path!r} links outside the server's --path "
                    f"{str(root)!r}; copy the file into the folder instead.",
                    param="path",
                )
        # Loading takes the engine lock between steps: keep the event loop free meanwhile.
        await asyncio.to_thread(service.engine.load_adapter, body.name, path)
        return {"id": body.name, "object": "model"}

    app.router.add_api_route(
        "/v1/adapters", load_adapter, methods=["POST"], route_class_override=CheckedJsonRoute
    )

    if training is not None:
        app.include_router(training_router(training))

    # The review page (HTML) over the same --path; `art review` serves it alone.
    app.mount("/review", create_review_app(art_path or Path(".art")))

    # ----------------------------------------------------------------------------- operations

    @app.get("/health")
    async def health():
        failure = service.engine.failure()
        if failure is not None:  # a process manager or load balancer takes this server out
            body = {"status": "engine_stopped", "engine": service.engine.name, "error": failure}
            return TolerantJSONResponse(body, status_code=503)
        return {"status": "ok", "engine": service.engine.name}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(_prometheus_metrics(service))

    app.openapi = lambda: describe_api(app, keyed=bool(api_key))  # type: ignore[method-assign]
    return app


async def _encoded_off_loop(content: Any) -> Response:
    """Stored records as a JSON answer, encoded on a worker thread with the plain encoder.

    FastAPI's encoder walks every token id in Python on the event loop: one 3.8 MB record held
    every other request 3-9 s. `json.dumps` takes tens of milliseconds for it.
    """
    return await asyncio.to_thread(TolerantJSONResponse, content)


async def _parsed_request(
    raw: Request, rollout_id: str | None, parse: Callable[[bytes], RequestT]
) -> tuple[str | None, RequestT]:
    """The rollout id (the rollout-scoped URL wins over the header, both validated) and the body
    parsed by `parse`; megabytes are parsed off the event loop so other clients do not stall."""
    rollout_id = rollout_id or raw.headers.get("x-rollout-id")
    if rollout_id is not None:
        validate_rollout_id(rollout_id)
    body = await raw.body()
    if len(body) > PARSE_ON_LOOP_MAX_BYTES:
        return rollout_id, await asyncio.to_thread(parse, body)
    return rollout_id, parse(body)


async def _answer(
    raw: Request,
    rollout_id: str | None,
    parse: Callable[[bytes], Any],
    stream: Callable[[Any, str | None], Awaitable[AsyncIterator[str]]],
    complete: Callable[[Any, str | None], Coroutine[Any, Any, Any]],
) -> Any:
    """One generation route (chat completions, responses): parse the body, then stream it as
    server-sent events or answer once, cancelled if the client goes away."""
    rollout_id, request = await _parsed_request(raw, rollout_id, parse)
    if request.stream:
        events = await stream(request, rollout_id)
        return StreamingResponse(events, media_type="text/event-stream")
    return await _unless_disconnected(raw, complete(request, rollout_id))


async def _unless_disconnected(raw: Request, work: Coroutine[Any, Any, Any]) -> Any:
    """Await `work`, cancelling it (and so its rows in the engine) if the client goes away."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
        if done:
            return task.result()
        if await raw.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return Response(status_code=499)  # nobody reads it; nginx's "client closed request"


def _parse_chat_request(body: bytes) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(parse_json_object(body)).came_in(len(body))


def _without_tokens(record: dict[str, Any]) -> dict[str, Any]:
    choices = [
        {key: value for key, value in choice.items() if key not in ("token_ids", "logprobs")}
        for choice in record["choices"]
    ]
    kept = {key: value for key, value in record.items() if key != "prompt_token_ids"}
    return {**kept, "choices": choices}


def _prometheus_metrics(service: ChatService) -> str:
    engine_metrics = service.engine.metrics
    steps = max(engine_metrics.decode_steps_total, 1)
    busy = engine_metrics.busy_seconds_total
    values: dict[str, tuple[str, float]] = {
        "art_requests_total": ("counter", engine_metrics.requests_total),
        "art_requests_failed_total": ("counter", engine_metrics.requests_failed),
        "art_requests_cancelled_total": ("counter", engine_metrics.requests_cancelled),
        "art_prompt_tokens_total": ("counter", engine_metrics.prompt_tokens_total),
        "art_generated_tokens_total": ("counter", engine_metrics.generated_tokens_total),
        "art_decode_steps_total": ("counter", engine_metrics.decode_steps_total),
        "art_prefill_batches_total": ("counter", engine_metrics.prefill_batches_total),
        "art_prefill_tokens_total": ("counter", engine_metrics.prefill_tokens_total),
        "art_prefill_shared_requests_total": (
            "counter",
            engine_metrics.prefill_shared_requests_total,
        ),
        "art_batch_size_mean": ("gauge", engine_metrics.decode_rows_total / steps),
        "art_batch_size_max": ("gauge", engine_metrics.max_batch_size_seen),
        "art_running_rows": ("gauge", service.engine.running_rows),
        "art_queue_depth": ("gauge", service.engine.queue_depth),
        "art_requests_preparing": ("gauge", service.preparing),
        "art_tokens_per_second": (
            "gauge",
            engine_metrics.generated_tokens_total / busy if busy else 0.0,
        ),
        "art_busy_seconds_total": ("counter", busy),
        "art_records": ("gauge", len(service.records)),
        "art_records_bytes": ("gauge", service.records.bytes),
        "art_records_total": ("counter", service.records.recorded),
        "art_record_evictions_total": ("counter", service.records.evictions),
        "art_record_evictions_by_bytes_total": ("counter", service.records.byte_evictions),
        "art_records_discarded_total": ("counter", service.records.discarded),
        "art_adapters_loaded": ("gauge", len(service.engine.adapters)),
        "art_process_resident_bytes": ("gauge", psutil.Process().memory_info().rss),
    }
    governor = getattr(service.engine, "threads", None)  # the torch engine on a CPU
    if governor is not None:
        values["art_torch_threads"] = ("gauge", governor.current())
        values["art_foreign_cores"] = ("gauge", round(governor.foreign_cores, 3))
        values["art_torch_thread_changes_total"] = ("counter", governor.changes_total)
    lines = ["# TYPE art_engine_info gauge", f'art_engine_info{{engine="{service.engine.name}"}} 1']
    for name, (kind, value) in values.items():
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name} {value}")
    return "\n".join(lines) + "\n"


def _error(
    status: int, error_type: str, message: str, *, param: str | None = None, code: Any = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _location(loc: tuple[Any, ...]) -> str | None:
    parts = [part for part in loc if part not in ("body",)]
    # pydantic names union branches ("str", "list[...]", "function-after[...]"): drop them.
    parts = [p for p in parts if not (isinstance(p, str) and ("[" in p or p in {"str", "int"}))]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or None


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app takes at this request's path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


def _register_error_handlers(app: FastAPI) -> None:
    from pydantic import ValidationError

    @app.exception_handler(BackendError)
    async def backend_error(_: Request, error: BackendError):
        if error.status_code >= 500:
            logger.error("request failed: %s", error.message)
        return _error(
            error.status_code, error.error_type, error.message, param=error.param, code=error.code
        )

    async def validation_error(_: Request, error: Any):
        first = error.errors()[0]
        param = _location(tuple(first.get("loc", ())))
        if tuple(first.get("loc", ())) == ("body",):  # no body, or not a JSON object
            message = (
                "The request body must be a JSON object, sent with Content-Type: "
                f"application/json ({first.get('msg', 'missing')})."
            )
            return _error(400, "invalid_request_error", message, code="invalid_value")
        if first.get("type") == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
        else:
            reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            message = f"Invalid value for `{param}`: {reason}" if param else reason
        return _error(400, "invalid_request_error", message, param=param, code="invalid_value")

    app.exception_handler(RequestValidationError)(validation_error)
    app.exception_handler(ValidationError)(validation_error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        response = _error(error.status_code, kind, str(error.detail))
        response.headers.update(error.headers or {})
        if error.status_code == 405:
            # Routing names the methods of the first route on the path; `Allow` must list all.
            response.headers["Allow"] = ", ".join(_allowed_methods(request))
        return response

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, error: Exception):
        logger.exception("unexpected error")
        return _error(500, "server_error", f"Internal error: {type(error).__name__}: {error}")
