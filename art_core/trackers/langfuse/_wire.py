"""The Langfuse wire: traces as OTLP spans and scores, exactly as the Langfuse v5 SDK sends them.

Spans: OTLP/HTTP protobuf, gzip, to `<host>/api/public/otel/v1/traces`, with Basic auth
(public key : secret key) and the headers LangfuseSpanProcessor sets, the SDK's attribute
names (`langfuse.observation.*`, `langfuse.trace.*`, `session.id`) and encodings, and the
`langfuse-sdk` instrumentation scope, so the server reads them as SDK spans. Scores: one JSON
list to `POST /api/public/scores` through the SDK's REST client (its ScoreConsumer's call).
The spans are built here rather than by the SDK's tracer because they carry the recorded
times of calls made earlier (the SDK's public API starts an observation now), and because the
SDK's client is one shared instance per public key, bound to the user's own Langfuse setup.
Imported only when there is something to send: langfuse and opentelemetry load lazily.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from langfuse import LangfuseOtelSpanAttributes
from langfuse._version import __version__ as SDK_VERSION
from langfuse.api import LangfuseAPI
from langfuse.api.core import ApiError
from langfuse.api.scores.types.create_score_batch_results import CreateScoreBatchResults
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

from art_core.trackers.langfuse._trace import Observation, TraceData

OTEL_TRACES_PATH = "/api/public/otel/v1/traces"
OTLP_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
SCORE_ATTEMPTS = 3
# Our worker threads' names start with this (their OTLP log lines become one warning).
WORKER_THREAD_NAME = "art-langfuse-export"


class Sender:
    """Spans over OTLP/HTTP and scores over the REST API, as the Langfuse SDK sends them."""

    def __init__(
        self,
        *,
        host: str,
        public_key: str,
        secret_key: str,
        environment: str | None,
        timeout: float,
    ) -> None:
        self.attributes = LangfuseOtelSpanAttributes
        self.environment = environment
        credentials = f"{public_key}:{secret_key}".encode()
        # The headers LangfuseSpanProcessor puts on its exporter (langfuse/_client/span_processor.py).
        headers = {
            "Authorization": "Basic " + base64.b64encode(credentials).decode("ascii"),
            "x-langfuse-sdk-name": "python",
            "x-langfuse-sdk-version": SDK_VERSION,
            "x-langfuse-public-key": public_key,
            "x-langfuse-ingestion-version": "4",
        }
        self.spans = OTLPSpanExporter(
            endpoint=host + OTEL_TRACES_PATH,
            headers=headers,
            timeout=timeout,
            compression=Compression.Gzip,
        )
        # The scope of the SDK's own tracer: the server reads these spans as SDK spans.
        self.scope = InstrumentationScope(
            "langfuse-sdk", SDK_VERSION, None, {"public_key": public_key}
        )
        resource: dict[str, Any] = {"service.name": "art-trainer"}
        if environment:
            resource[LangfuseOtelSpanAttributes.ENVIRONMENT] = environment
        self.resource = Resource.create(resource)
        self.api = LangfuseAPI(
            base_url=host,
            username=public_key,
            password=secret_key,
            x_langfuse_sdk_name="python",
            x_langfuse_sdk_version=SDK_VERSION,
            x_langfuse_public_key=public_key,
            timeout=timeout,
        )

    def send_spans(self, traces: list[TraceData]) -> str | None:
        """Export the traces' spans (the OTLP exporter retries 429/5xx and refused
        connections within the timeout); None on success, else the reason."""
        spans = [span for trace in traces for span in self._spans(trace)]
        _exporter_log_note.last = None
        result = self.spans.export(spans)
        if result is SpanExportResult.SUCCESS:
            return None
        return _exporter_log_note.last or "the OTLP export failed"

    def send_scores(self, traces: list[TraceData]) -> str | None:
        """POST the traces' scores as one list (the SDK's ScoreConsumer call); None on success."""
        scores = [
            {
                "id": score.id,
                "traceId": trace.trace_id,
                "name": score.name,
                "value": score.value,
                "dataType": "NUMERIC",
                **({"comment": score.comment} if score.comment else {}),
                **({"environment": self.environment} if self.environment else {}),
                **({"timestamp": _iso(score.timestamp)} if score.timestamp is not None else {}),
            }
            for trace in traces
            for score in trace.scores
        ]
        if not scores:
            return None
        reason = "unknown"
        for attempt in range(SCORE_ATTEMPTS):
            try:
                response = self.api.scores.create(
                    request=scores,  # type: ignore[arg-type]
                    request_options={"max_retries": 0},
                )
            except ApiError as error:
                reason = f"scores: HTTP {error.status_code}"
                retry = (
                    error.status_code is None
                    or error.status_code >= 500
                    or error.status_code == 429
                )
            except httpx.TransportError as error:
                reason, retry = f"scores: {type(error).__name__}: {error}", True
            else:
                if isinstance(response, CreateScoreBatchResults) and response.rejected:
                    messages = "; ".join(e.message for e in response.errors)
                    return f"scores: {response.rejected} rejected ({messages})"
                return None
            if not retry or attempt + 1 == SCORE_ATTEMPTS:
                break
            time.sleep(0.5 * 2**attempt)
        return reason

    def _spans(self, trace: TraceData) -> list[ReadableSpan]:
        """One finished span per observation, with the trace's ids and recorded times."""
        trace_id = int(trace.trace_id, 16)
        trace_attributes = self._trace_attributes(trace)
        spans = []
        for observation in trace.observations:
            context = SpanContext(
                trace_id, int(observation.id, 16), is_remote=False, trace_flags=TraceFlags(1)
            )
            parent = (
                SpanContext(trace_id, int(observation.parent_id, 16), is_remote=False)
                if observation.parent_id
                else None
            )
            attributes = {**trace_attributes, **self._observation_attributes(observation)}
            if observation.parent_id is None:
                attributes[self.attributes.IS_APP_ROOT] = True
            spans.append(
                ReadableSpan(
                    name=observation.name,
                    context=context,
                    parent=parent,
                    resource=self.resource,
                    attributes=attributes,
                    start_time=_nanoseconds(observation.start),
                    end_time=_nanoseconds(observation.end),
                    instrumentation_scope=self.scope,
                )
            )
        return spans

    def _trace_attributes(self, trace: TraceData) -> dict[str, Any]:
        """What `propagate_attributes(...)` puts on every span of a trace."""
        names = self.attributes
        attributes: dict[str, Any] = {
            names.TRACE_NAME: trace.name,
            names.TRACE_SESSION_ID: trace.session_id,
            names.TRACE_TAGS: list(trace.tags),
        }
        for key, value in trace.metadata.items():
            attributes[f"{names.TRACE_METADATA}.{key}"] = _metadata_value(value)
        if self.environment:
            attributes[names.ENVIRONMENT] = self.environment
        return attributes

    def _observation_attributes(self, observation: Observation) -> dict[str, Any]:
        """The attributes the SDK's observation wrappers write (langfuse/_client/attributes.py)."""
        names = self.attributes
        attributes: dict[str, Any] = {names.OBSERVATION_TYPE: observation.type}
        if observation.input is not None:
            attributes[names.OBSERVATION_INPUT] = _payload(observation.input)
        if observation.output is not None:
            attributes[names.OBSERVATION_OUTPUT] = _payload(observation.output)
        if observation.model:
            attributes[names.OBSERVATION_MODEL] = observation.model
        if observation.model_parameters:
            attributes[names.OBSERVATION_MODEL_PARAMETERS] = _payload(observation.model_parameters)
        if observation.usage:
            attributes[names.OBSERVATION_USAGE_DETAILS] = _payload(observation.usage)
        for key, value in observation.metadata.items():
            if value is not None:
                attributes[f"{names.OBSERVATION_METADATA}.{key}"] = _metadata_value(value)
        return attributes


class _ExporterLogNote(logging.Filter):
    """Keeps the OTLP exporter's error lines for our single warning, and out of the log, when
    they come from one of our worker threads (other users of that exporter are left alone)."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    @property
    def last(self) -> str | None:
        return getattr(self._local, "last", None)

    @last.setter
    def last(self, message: str | None) -> None:
        self._local.last = message

    def filter(self, record: logging.LogRecord) -> bool:
        if not threading.current_thread().name.startswith(WORKER_THREAD_NAME):
            return True
        if record.levelno >= logging.ERROR or self.last is None:
            self.last = record.getMessage()
        return False


_exporter_log_note = _ExporterLogNote()
logging.getLogger(OTLP_EXPORTER_LOGGER).addFilter(_exporter_log_note)


def _payload(value: Any) -> str:
    """Input, output, usage and parameters: JSON, as the SDK's `_serialize` (strings as is)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, ensure_ascii=False)


def _metadata_value(value: Any) -> str:
    """One metadata value, JSON-encoded (strings too), as the v5 SDK writes metadata."""
    return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)


def _nanoseconds(seconds: float | None) -> int:
    return int((seconds if seconds is not None else time.time()) * 1e9)


def _iso(seconds: float) -> str:
    """UTC with a Z, as the SDK sends score timestamps."""
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
