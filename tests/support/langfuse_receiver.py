"""A loopback Langfuse for the tests: the two ingestion endpoints the v5 SDK writes to.

A real Langfuse server (Next.js, Postgres, ClickHouse, Redis, S3) cannot run here, so this one
speaks its wire protocol on 127.0.0.1, as read from the langfuse SDK 5.x source:

- `POST /api/public/otel/v1/traces`: OTLP/HTTP, body an `ExportTraceServiceRequest` protobuf
  (`Content-Type: application/x-protobuf`, gzip when `Content-Encoding: gzip`), decoded here
  with opentelemetry-proto's classes; answers 200 with an empty `ExportTraceServiceResponse`.
- `POST /api/public/scores`: a JSON list of scores (`id`, `traceId`, `name`, `value`,
  `dataType`, ...); answers 202 `{"message": "Accepted"}`.
- `GET /api/public/projects`: the SDK's `auth_check()` and `get_trace_url()` call.

Every route needs `Authorization: Basic base64(public_key:secret_key)`; a wrong or missing one
is a 401 with Langfuse's error body. `fail_next` queues statuses (503, 429...) answered before
the next success, to exercise retries.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PUBLIC_KEY = "pk-lf-test"
SECRET_KEY = "sk-lf-test"
PROJECT_ID = "project-art-tests"


@dataclass
class ReceivedSpan:
    """One span as Langfuse's OTLP endpoint decodes it."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    scope_name: str
    scope_version: str
    scope_attributes: dict[str, Any]
    resource: dict[str, Any]

    def attribute_json(self, key: str) -> Any:
        """A JSON-encoded attribute (input, output, usage, metadata values), decoded."""
        return json.loads(self.attributes[key])

    @property
    def type(self) -> str | None:
        return self.attributes.get("langfuse.observation.type")

    def metadata(self, key: str) -> Any:
        return self.attribute_json(f"langfuse.observation.metadata.{key}")

    def trace_metadata(self, key: str) -> Any:
        return self.attribute_json(f"langfuse.trace.metadata.{key}")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    status: int


@dataclass
class LangfuseReceiver:
    """What the loopback Langfuse received, and how it answers."""

    url: str = ""
    public_key: str = PUBLIC_KEY
    secret_key: str = SECRET_KEY
    spans: list[ReceivedSpan] = field(default_factory=list)
    scores: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.spans.clear()
            self.scores.clear()
            self.requests.clear()
            self.fail_next.clear()

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        """Spans by trace id, in arrival order."""
        by_trace: dict[str, list[ReceivedSpan]] = {}
        for span in self.spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        return by_trace

    def scores_of(self, trace_id: str) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in self.scores if s["traceId"] == trace_id}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode_spans(body: bytes) -> list[ReceivedSpan]:
    """An OTLP ExportTraceServiceRequest as Langfuse reads it."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        scope_name=scope.name,
                        scope_version=scope.version,
                        scope_attributes=_attributes(scope.attributes),
                        resource=resource,
                    )
                )
    return spans


def _handler(receiver: LangfuseReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet test output
            pass

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            with receiver.lock:
                receiver.requests.append(
                    Request(self.command, self.path, dict(self.headers.items()), status)
                )
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, payload: Any) -> None:
            self._answer(status, json.dumps(payload).encode(), "application/json")

        def _authorized(self) -> bool:
            credentials = f"{receiver.public_key}:{receiver.secret_key}".encode()
            expected = "Basic " + base64.b64encode(credentials).decode()
            if self.headers.get("Authorization") == expected:
                return True
            # Langfuse's answer to a wrong key pair (web/src/features/public-api/server).
            self._json(
                401,
                {
                    "message": "Invalid credentials. Confirm that you've configured the correct host."
                },
            )
            return False

        def _injected_failure(self) -> bool:
            with receiver.lock:
                status = receiver.fail_next.pop(0) if receiver.fail_next else None
            if status is None:
                return False
            self._json(status, {"message": "injected failure"})
            return True

        def _body(self) -> bytes:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return body

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path.startswith("/api/public/projects"):
                project = {
                    "id": PROJECT_ID,
                    "name": "art tests",
                    "organization": {"id": "org-art-tests", "name": "art"},
                    "metadata": {},
                }
                self._json(200, {"data": [project]})
            else:
                self._json(404, {"message": "not found"})

        def do_POST(self) -> None:
            body = self._body()
            if not self._authorized() or self._injected_failure():
                return
            if self.path == "/api/public/otel/v1/traces":
                if self.headers.get("Content-Type") != "application/x-protobuf":
                    self._json(415, {"message": "expected application/x-protobuf"})
                    return
                spans = decode_spans(body)
                with receiver.lock:
                    receiver.spans += spans
                response = ExportTraceServiceResponse().SerializeToString()
                self._answer(200, response, "application/x-protobuf")
            elif self.path == "/api/public/scores":
                scores = json.loads(body)
                if not isinstance(scores, list) or not all(
                    {"id", "traceId", "name", "value"} <= set(s) for s in scores
                ):
                    self._json(400, {"message": "expected a list of scores"})
                    return
                with receiver.lock:
                    receiver.scores += scores
                self._json(202, {"message": "Accepted"})
            else:
                self._json(404, {"message": "not found"})

    return Handler


def start_receiver() -> tuple[LangfuseReceiver, ThreadingHTTPServer]:
    receiver = LangfuseReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver, server


@pytest.fixture(scope="session")
def langfuse_receiver_server() -> Iterator[LangfuseReceiver]:
    receiver, server = start_receiver()
    yield receiver
    server.shutdown()
    server.server_close()


@pytest.fixture
def langfuse_receiver(langfuse_receiver_server: LangfuseReceiver) -> Iterator[LangfuseReceiver]:
    """The loopback Langfuse with nothing received yet and the right keys."""
    langfuse_receiver_server.reset()
    yield langfuse_receiver_server
    langfuse_receiver_server.reset()


@pytest.fixture
def exporter(langfuse_receiver: LangfuseReceiver) -> Iterator[Any]:
    """An `art.LangfuseExporter` sending to the loopback Langfuse with the right keys."""
    import art_core as art

    exporter = art.LangfuseExporter(
        public_key=PUBLIC_KEY, secret_key=SECRET_KEY, host=langfuse_receiver.url, timeout=2.0
    )
    yield exporter
    exporter.close(timeout=5)
