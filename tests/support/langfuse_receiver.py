"""A loopback Langfuse for the tests: the two ingestion endpoints the v5 SDK writes to.

A real Langfuse server (Next.js, Postgres, ClickHouse, Redis, S3) cannot run here, so this one
speaks its wire protocol on 127.0.0.1, as read from the langfuse SDK 5.x source:

- `POST /api/public/otel/v1/traces`: OTLP/HTTP, body an `ExportTraceServiceRequest` protobuf
  (`Content-Type: application/x-protobuf`, gzip when `Content-Encoding: gzip`), decoded here
  with opentelemetry-proto's classes; answers 200 with an empty `ExportTraceServiceResponse`.
- `POST /api/public/scores`: a JSON list of scores (`id`, `traceId`, `name`, `value`,
  `dataType`, ...); answers 202 `{"message": "Accepted"}`.
- `GET /api/public/projects`: the SDK's `auth_check()` and `get_trace_url()` call.

And the read side the review read-back uses (`langfuse.api`'s `scores.get_many` and
`annotation_queues.*`; each answer parses as the SDK's pydantic model, which the tests check):

- `GET /api/public/v3/scores?traceId=a,b&name=x,y&fields=details,subject,annotation&limit=
  &cursor=`: `{"data": [ScoreV3...], "meta": {"limit": n, "cursor": next or absent}}`, each
  score with the core fields (`id`, `projectId`, `name`, `value`, `dataType`, `source`,
  `timestamp`, `environment`, `createdAt`, `updatedAt`) plus the asked-for groups. The scores
  are those POSTed (source `API`) and those a test makes as a person would in the UI
  (`add_score`, source `ANNOTATION`).
- `POST /api/public/annotation-queues/{queueId}/items` (`objectId`, `objectType`, `status`):
  an `AnnotationQueueItem`; `GET` of the same path (`status`, `page`, `limit`): `{"data":
  [...], "meta": {"page", "limit", "totalItems", "totalPages"}}`. An unknown queue is a 404.

Every route needs `Authorization: Basic base64(public_key:secret_key)`; a wrong or missing one
is a 401 with Langfuse's error body. `fail_next` queues statuses (503, 429...) answered before
the next success, to exercise retries.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

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
    queues: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.spans.clear()
            self.scores.clear()
            self.requests.clear()
            self.fail_next.clear()
            self.queues.clear()

    def add_score(
        self,
        trace_id: str,
        name: str,
        value: float | bool | str,
        *,
        comment: str | None = None,
        author: str | None = "user-ann",
    ) -> dict[str, Any]:
        """A score as a person sets it on a trace in the Langfuse UI (source ANNOTATION)."""
        data_type = (
            "BOOLEAN"
            if isinstance(value, bool)
            else "CATEGORICAL"
            if isinstance(value, str)
            else "NUMERIC"
        )
        score = {
            "id": str(uuid.uuid4()),
            "traceId": trace_id,
            "name": name,
            "value": value,
            "dataType": data_type,
            "source": "ANNOTATION",
            "timestamp": _now(),
            **({"comment": comment} if comment else {}),
            **({"authorUserId": author} if author else {}),
        }
        with self.lock:
            self.scores.append(score)
        return score

    def add_queue(self, queue_id: str) -> None:
        with self.lock:
            self.queues.setdefault(queue_id, [])

    def set_queue_status(self, queue_id: str, status: str) -> None:
        """Mark every item of a queue PENDING or COMPLETED, as a person does in the UI."""
        with self.lock:
            for item in self.queues[queue_id]:
                item["status"] = status
                item["completedAt"] = _now() if status == "COMPLETED" else None
                item["updatedAt"] = _now()

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        """Spans by trace id, in arrival order."""
        by_trace: dict[str, list[ReceivedSpan]] = {}
        for span in self.spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        return by_trace

    def scores_of(self, trace_id: str) -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in self.scores if s["traceId"] == trace_id}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def score_v3(score: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """A stored score as `GET /api/public/v3/scores` returns it: the core fields, then the
    groups asked for in `fields` (details, subject, annotation)."""
    data_type = score.get("dataType", "NUMERIC")
    value = score["value"]
    if data_type == "BOOLEAN":
        value = bool(value)
    timestamp = score.get("timestamp") or _now()
    answer: dict[str, Any] = {
        "id": score["id"],
        "projectId": PROJECT_ID,
        "name": score["name"],
        "value": value,
        "dataType": data_type,
        "source": score.get("source", "API"),
        "timestamp": timestamp,
        "environment": score.get("environment", "default"),
        "createdAt": timestamp,
        "updatedAt": timestamp,
    }
    if "details" in fields:
        answer.update(
            comment=score.get("comment"), configId=None, metadata=score.get("metadata") or {}
        )
    if "subject" in fields:
        answer["subject"] = {"kind": "trace", "id": score["traceId"]}
    if "annotation" in fields:
        answer.update(authorUserId=score.get("authorUserId"), queueId=score.get("queueId"))
    return answer


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
            url = urlsplit(self.path)
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            queue = _queue_items_path(url.path)
            if url.path == "/api/public/v3/scores":
                self._scores_v3(query)
            elif queue is not None:
                with receiver.lock:
                    items = receiver.queues.get(queue)
                    items = None if items is None else [dict(item) for item in items]
                if items is None:
                    self._json(404, {"message": f"Annotation queue {queue} not found"})
                    return
                if "status" in query:
                    items = [item for item in items if item["status"] == query["status"]]
                page, limit = int(query.get("page", 1)), int(query.get("limit", 50))
                meta = {
                    "page": page,
                    "limit": limit,
                    "totalItems": len(items),
                    "totalPages": -(-len(items) // limit),
                }
                self._json(200, {"data": items[(page - 1) * limit : page * limit], "meta": meta})
            elif self.path.startswith("/api/public/projects"):
                project = {
                    "id": PROJECT_ID,
                    "name": "art tests",
                    "organization": {"id": "org-art-tests", "name": "art"},
                    "metadata": {},
                }
                self._json(200, {"data": [project]})
            else:
                self._json(404, {"message": "not found"})

        def _scores_v3(self, query: dict[str, str]) -> None:
            limit = int(query.get("limit", 50))
            if limit > 100:
                self._json(400, {"message": "limit must be at most 100"})
                return
            fields = set(filter(None, query.get("fields", "").split(",")))
            if fields - {"details", "subject", "annotation"}:
                self._json(400, {"message": f"unknown fields {sorted(fields)}"})
                return
            traces = set(filter(None, query.get("traceId", "").split(",")))
            names = set(filter(None, query.get("name", "").split(",")))
            with receiver.lock:
                matching = [
                    score
                    for score in receiver.scores
                    if (not traces or score["traceId"] in traces)
                    and (not names or score["name"] in names)
                ]
            start = int(query.get("cursor") or 0)  # an opaque cursor: here, an offset
            page = matching[start : start + limit]
            meta: dict[str, Any] = {"limit": limit}
            if start + limit < len(matching):
                meta["cursor"] = str(start + limit)
            self._json(200, {"data": [score_v3(s, fields) for s in page], "meta": meta})

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
            elif (queue := _queue_items_path(self.path)) is not None:
                request = json.loads(body)
                with receiver.lock:
                    items = receiver.queues.get(queue)
                    if items is not None:
                        now = _now()
                        item = {
                            "id": str(uuid.uuid4()),
                            "queueId": queue,
                            "objectId": request["objectId"],
                            "objectType": request["objectType"],
                            "status": request.get("status") or "PENDING",
                            "completedAt": None,
                            "createdAt": now,
                            "updatedAt": now,
                        }
                        items.append(item)
                if items is None:
                    self._json(404, {"message": f"Annotation queue {queue} not found"})
                else:
                    self._json(200, item)
            else:
                self._json(404, {"message": "not found"})

    return Handler


def _queue_items_path(path: str) -> str | None:
    """The queue id of `/api/public/annotation-queues/{queueId}/items`, else None."""
    parts = urlsplit(path).path.strip("/").split("/")
    if (
        len(parts) == 5
        and parts[:3] == ["api", "public", "annotation-queues"]
        and parts[4] == "items"
    ):
        return parts[3]
    return None


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
