"""The HTTP app, composed: the middlewares (Host and origin, the API key, the body size), each
wing's routes (serving, training, the review page), operations (/health, /metrics), and the
errors mapped to OpenAI's shape in one place."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from art_backend._auth import ApiKeyMiddleware
from art_backend._errors import BackendError, error_body, reported_error
from art_backend._host_guard import HostGuardMiddleware
from art_backend._limits import (
    DEFAULT_MAX_BODY_MB,
    MIB,
    BodySizeLimitMiddleware,
)
from art_backend._openapi import describe_api
from art_backend._unicode import TolerantJSONResponse, tolerant_app
from art_backend.review._app import create_review_app
from art_backend.serving._engine_routes import attach_engine_routes
from art_backend.serving._models_routes import attach_model_routes
from art_backend.serving._records_routes import attach_record_routes
from art_backend.serving.chat import attach_chat_routes
from art_backend.serving.chat._service import ChatService
from art_backend.serving.completions import attach_completion_routes
from art_backend.serving.messages import attach_message_routes
from art_backend.serving.responses import attach_response_routes
from art_backend.tinker import attach_tinker_routes
from art_backend.training._routes import training_router
from art_backend.training._training_service import TrainingService

logger = logging.getLogger("art_backend.app")


def create_app(
    service: ChatService,
    *,
    api_key: str | None = None,
    art_path: Path | None = None,
    training: TrainingService | None = None,
    allowed_hosts: list[str] | None = None,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    engine_routes: bool = False,
) -> FastAPI:
    """Build the FastAPI app around a started engine's chat service.

    `allowed_hosts`: host names a browser may reach it by besides localhost and IP addresses.
    `engine_routes`: lend the engine to another art-server (`serving._engine_routes`).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn has drained in-flight requests by now (SIGTERM); let the engine finish too.
        service.engine.stop()

    app = tolerant_app("art-server", lifespan=lifespan)
    app.state.service = service
    app.state.training = training

    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=int(max_body_mb * MIB))
    # Added last, so it runs first: a page on another site is refused before anything else.
    app.add_middleware(HostGuardMiddleware, allowed_hosts=allowed_hosts or [])
    _register_error_handlers(app)

    attach_chat_routes(app, service)  # each protocol attaches its routes, in the described order
    attach_record_routes(app, service)
    attach_completion_routes(app, service)
    attach_response_routes(app, service)
    attach_message_routes(app, service)
    attach_model_routes(app, service, art_path or Path(".art"))
    if engine_routes:
        attach_engine_routes(app, service, art_path or Path(".art"))
    if training is not None:
        app.include_router(training_router(training))
        # The Tinker API (/api/v1/...): training runs and sampling through the `tinker` SDK.
        attach_tinker_routes(app, service.engine, service.base_names, training)

    # The review page (HTML) over the same --path; `art review` serves it alone.
    app.mount("/review", create_review_app(art_path or Path(".art")))

    # ----------------------------------------------------------------------------- operations

    @app.get("/health")
    async def health():
        failure = service.engine.failure()
        # Engine replicas: each one's state (a replica taken out leaves the server up).
        replicas = getattr(service.engine, "replica_states", None)
        extra = {"replicas": replicas()} if replicas is not None else {}
        if failure is not None:  # a process manager or load balancer takes this server out
            body = {
                "status": "engine_stopped",
                "engine": service.engine.name,
                "error": failure,
                **extra,
            }
            return TolerantJSONResponse(body, status_code=503)
        return {"status": "ok", "engine": service.engine.name, **extra}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(_prometheus_metrics(service))

    app.openapi = lambda: describe_api(app, keyed=bool(api_key))  # type: ignore[method-assign]
    return app


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
        "art_grammars_compiling": ("gauge", service.grammars.compiling),
        "art_grammar_compiles_total": ("counter", service.grammars.compiles),
        "art_streams_stalled_total": ("counter", service.stalled_streams),
        "art_tokens_per_second": (
            "gauge",
            engine_metrics.generated_tokens_total / busy if busy else 0.0,
        ),
        "art_busy_seconds_total": ("counter", busy),
        "art_decode_forward_seconds_total": (
            "counter",
            engine_metrics.decode_forward_seconds_total,
        ),
        "art_decode_sampling_seconds_total": (
            "counter",
            engine_metrics.decode_sampling_seconds_total,
        ),
        "art_decode_rows_seconds_total": ("counter", engine_metrics.decode_rows_seconds_total),
        "art_decode_compiled_steps_total": ("counter", engine_metrics.decode_compiled_steps_total),
        "art_decode_compile_seconds_total": (
            "counter",
            engine_metrics.decode_compile_seconds_total,
        ),
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
    replicas = getattr(service.engine, "replica_states", None)
    if replicas is not None:
        lines += _replica_lines(replicas(), getattr(service.engine, "counters", None))
    return "\n".join(lines) + "\n"


def _replica_lines(states: list[dict[str, Any]], counters: Any) -> list[str]:
    """Engine replicas: per replica up, rows in flight and requests routed; prefix reuse."""
    lines = []
    for name, kind, key in [
        ("art_replica_up", "gauge", "up"),
        ("art_replica_rows_in_flight", "gauge", "rows_in_flight"),
        ("art_replica_requests_routed_total", "counter", "requests_routed"),
        ("art_replica_requests_failed_by_takeout_total", "counter", "requests_failed_by_takeout"),
        ("art_replica_taken_back_total", "counter", "taken_back"),
    ]:
        lines.append(f"# TYPE {name} {kind}")
        lines += [f'{name}{{replica="{s["replica"]}"}} {int(s[key])}' for s in states]
    for name, value in [
        ("art_replica_follow_up_turns_total", counters.follow_up_turns),
        ("art_replica_follow_up_same_replica_total", counters.follow_up_same_replica),
        ("art_replica_follow_up_prompt_tokens_total", counters.follow_up_prompt_tokens),
        ("art_replica_reusable_prefix_tokens_total", counters.reusable_prefix_tokens),
    ]:
        lines += [f"# TYPE {name} counter", f"{name} {value}"]
    return lines


def _error(
    request: Request,
    status: int,
    error_type: str,
    message: str,
    *,
    param: str | None = None,
    code: Any = None,
) -> JSONResponse:
    body = error_body(request.url.path, message, error_type=error_type, param=param, code=code)
    return JSONResponse(body, status_code=status)


# What a request to a path no route serves is told: the APIs this server speaks.
SERVED_APIS = (
    "OpenAI Chat Completions (POST /v1/chat/completions), OpenAI Completions (POST "
    "/v1/completions), OpenAI Responses (POST /v1/responses), Anthropic Messages (POST "
    "/v1/messages), each also under "
    "/rollouts/{rollout_id}/v1/...; GET /v1/models; the records (GET "
    "/v1/chat/completions/{id}, GET /v1/rollouts/{id}); adapters (POST /v1/adapters); training "
    "(/v1/training/...); the Tinker API (/api/v1/...); /health, /metrics, /openapi.json and "
    "the review page (/review/)"
)


def _no_route_message(method: str, path: str) -> str:
    """A 404 that names the APIs served, and the usual slip of a client's base URL."""
    hint = ""
    if "/v1/v1/" in path:
        hint = (
            " The base URL ends in /v1 and the client appends /v1 again: Anthropic's SDKs "
            "and Claude Code append /v1/messages themselves, so give them the server's root "
            "(or /rollouts/{id}), without /v1."
        )
    return f"No route {method} {path} on this server.{hint} It serves: {SERVED_APIS}."


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app takes at this request's path."""
    methods: set[str] = set()
    for route in _every_route(request.app.router.routes):
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


def _every_route(routes: list[Any]) -> Iterator[Any]:
    """The routes, those of included routers too (FastAPI keeps an included router whole)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _every_route(included.routes)
        else:
            yield route


def _register_error_handlers(app: FastAPI) -> None:
    from pydantic import ValidationError

    @app.exception_handler(BackendError)
    async def backend_error(request: Request, error: BackendError):
        if error.status_code >= 500:
            logger.error("request failed: %s", error.message)
        return _error(
            request,
            error.status_code,
            error.error_type,
            error.message,
            param=error.param,
            code=error.code,
        )

    async def validation_error(request: Request, error: Any):
        first, param = reported_error(error.errors())
        no_body = first.get("type") in ("missing", "model_attributes_type", "dict_type")
        if tuple(first.get("loc", ())) == ("body",) and no_body:  # no body, or not an object
            message = (
                "The request body must be a JSON object, sent with Content-Type: "
                f"application/json ({first.get('msg', 'missing')})."
            )
            return _error(request, 400, "invalid_request_error", message, code="invalid_value")
        if first.get("type") == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
        else:
            reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            message = f"Invalid value for `{param}`: {reason}" if param else reason
        return _error(
            request, 400, "invalid_request_error", message, param=param, code="invalid_value"
        )

    app.exception_handler(RequestValidationError)(validation_error)
    app.exception_handler(ValidationError)(validation_error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        message = str(error.detail)
        if error.status_code == 404 and error.detail == "Not Found":  # no route at this path
            message = _no_route_message(request.method, request.url.path)
            if "/messages" in request.url.path:  # Anthropic's clients read `"type": "error"`
                error_body = {"message": message, "type": kind, "param": None, "code": None}
                return JSONResponse({"type": "error", "error": error_body}, status_code=404)
            return _error(request, 404, kind, message)
        allowed = _allowed_methods(request) if error.status_code == 405 else []
        if allowed:  # Routing names the first route's methods on the path; these are all.
            message = (
                f"{request.method} is not a method of {request.url.path}; it takes "
                f"{', '.join(allowed)}."
            )
        response = _error(request, error.status_code, kind, message)
        response.headers.update(error.headers or {})
        if allowed:
            response.headers["Allow"] = ", ".join(allowed)
        return response

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception):
        logger.exception("unexpected error")
        message = f"Internal error: {type(error).__name__}: {error}"
        return _error(request, 500, "server_error", message)
