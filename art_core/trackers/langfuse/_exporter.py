"""The Langfuse exporter: trajectories become traces, sent in the background, out of the way.

The wire (`_wire.py`) is what the Langfuse v5 SDK sends: OTLP protobuf spans to
`<host>/api/public/otel/v1/traces` and a JSON list of scores to `/api/public/scores`, with
Basic auth. The trace itself is built by pure functions in `_trace.py`.

One worker thread per exporter takes jobs (`ExportJob`, one per train or log call) from a bounded
queue: it reads the calls' records from the backend in one request, waits for the step's
advantages (train), builds the traces (`_trace.py`) and sends them. A full queue, Langfuse down
or a wrong key drop traces with a count (`stats()`, `art.langfuse_stats()`, the next step's
`langfuse/exported_traces` and `langfuse/dropped_traces`) and one warning; nothing raises into
training. Every exporter alive is in `LIVE_EXPORTERS` (the step metrics and `flush_langfuse`
read them all); at exit each gets a bounded chance to send what is queued.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import logging
import os
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from art_core._observers import ObservedModel
from art_core.errors import LangfuseConfigError, LangfuseNotInstalledError
from art_core.trackers.langfuse._trace import (
    TraceContext,
    completion_ids,
    trace_from_trajectory,
    trace_id_for,
)
from art_core.trajectories import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from art_core.trackers.langfuse._wire import Sender

logger = logging.getLogger("art_core.langfuse")

ENV_VARIABLES = (
    "LANGFUSE_PUBLIC_KEY",
    "LANGFUSE_SECRET_KEY",
    "LANGFUSE_HOST (or LANGFUSE_BASE_URL)",
)
TRACES_PER_REQUEST = 50  # keeps a request well under Langfuse's body limits
RECORDS_PER_REQUEST = 2_000  # the backend's lookup route takes up to 10,000 ids
EXIT_FLUSH_SECONDS = 10.0


def langfuse_installed() -> bool:
    """Whether the `[langfuse]` extra (the langfuse SDK) is importable."""
    return importlib.util.find_spec("langfuse") is not None


def env_configured() -> bool:
    """Whether the environment enables export: both keys and a host are set."""
    host = os.environ.get("LANGFUSE_HOST") or os.environ.get("LANGFUSE_BASE_URL")
    return bool(
        os.environ.get("LANGFUSE_PUBLIC_KEY") and os.environ.get("LANGFUSE_SECRET_KEY") and host
    )


def require_langfuse() -> None:
    if not langfuse_installed():
        raise LangfuseNotInstalledError(
            "Langfuse export needs the langfuse SDK: pip install 'art-trainer[langfuse]' "
            "(or leave 'langfuse' out of report_metrics / unset LANGFUSE_PUBLIC_KEY to train "
            "without it)."
        )


@dataclass
class ExportJob:
    """One train or log call's trajectories, waiting in the exporter's queue."""

    items: list[tuple[Trajectory, TraceContext]]
    owner: str  # "<project>/<model>": whose step metrics report the counts
    records_url: str | None = None
    api_key: str | None = None
    advantages: dict[str, float] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)
    counted: int = 0  # traces already counted as exported or dropped

    def release(self, advantages: dict[str, float] | None = None) -> None:
        """The step is over (or failed): the worker may send, with these advantages."""
        self.advantages = dict(advantages or {})
        self.ready.set()


class LangfuseExporter:
    """Sends trajectories to one Langfuse project as traces, from a background thread.

    Arguments default to LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_HOST (or
    LANGFUSE_BASE_URL); LANGFUSE_TRACING_ENVIRONMENT sets the environment. `timeout` bounds one
    request with its retries; `max_queued_traces` bounds memory (more are dropped, counted).
    """

    def __init__(
        self,
        *,
        public_key: str | None = None,
        secret_key: str | None = None,
        host: str | None = None,
        environment: str | None = None,
        timeout: float = 10.0,
        max_queued_traces: int = 10_000,
    ) -> None:
        require_langfuse()
        self.public_key = public_key or os.environ.get("LANGFUSE_PUBLIC_KEY") or ""
        self._secret_key = secret_key or os.environ.get("LANGFUSE_SECRET_KEY") or ""
        resolved_host = (
            host or os.environ.get("LANGFUSE_HOST") or os.environ.get("LANGFUSE_BASE_URL") or ""
        )
        missing = [
            name
            for name, value in zip(
                ENV_VARIABLES, (self.public_key, self._secret_key, resolved_host), strict=True
            )
            if not value
        ]
        if missing:
            raise LangfuseConfigError(
                f"Langfuse export needs {', '.join(missing)}: set them (Langfuse Cloud: "
                "https://cloud.langfuse.com, project settings > API keys; self-hosted: your "
                "instance's URL), or pass public_key=, secret_key=, host= to art.LangfuseExporter."
            )
        self.host = resolved_host.rstrip("/")
        self.environment = environment or os.environ.get("LANGFUSE_TRACING_ENVIRONMENT")
        self.timeout = timeout
        self.max_queued_traces = max_queued_traces
        self._queue: queue.Queue[ExportJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued_traces = 0
        self._stats: Counter[str] = Counter()
        self._unreported: dict[str, Counter[str]] = {}
        self._warned: set[str] = set()
        self._last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sender: Sender | None = None
        LIVE_EXPORTERS.add(self)

    def __repr__(self) -> str:
        return f"LangfuseExporter(host={self.host!r}, public_key={self.public_key!r})"

    # ------------------------------------------------------------------------------ the API

    def trace_url(self, trajectory_id: str) -> str:
        """Where the trajectory's trace is in the Langfuse UI (redirects to its project)."""
        return f"{self.host}/trace/{trace_id_for(trajectory_id)}"

    def export_groups(
        self,
        model: ObservedModel,
        groups: Iterable[TrajectoryGroup],
        *,
        split: str,
        step: int,
        wait_for_advantages: bool = False,
    ) -> ExportJob | None:
        """Queue these groups' trajectories as traces; returns at once (None when dropped).

        Each trajectory gets `metadata["langfuse_trace_url"]`. With `wait_for_advantages`,
        the traces are sent after `job.release(advantages)` (the train call does it).
        """
        items: list[tuple[Trajectory, TraceContext]] = []
        for index, group in enumerate(groups):
            scenario = group.metadata.get("scenario") if group.metadata else None
            for trajectory in group.trajectories:
                trajectory.metadata["langfuse_trace_url"] = self.trace_url(trajectory.id)
                snapshot = _snapshot(trajectory)
                if scenario is not None and "scenario" not in snapshot.metadata:
                    snapshot.metadata["scenario"] = scenario
                context = TraceContext(
                    project=model.project, model=model.name, step=step, split=split, group=index
                )
                items.append((snapshot, context))
        base_url = model.inference_base_url
        job = ExportJob(
            items=items,
            owner=f"{model.project}/{model.name}",
            records_url=f"{base_url}/chat/completions/lookup" if base_url else None,
            api_key=model.inference_api_key,
        )
        if not wait_for_advantages:
            job.ready.set()
        return job if self._enqueue(job) else None

    def stats(self) -> dict[str, Any]:
        """Counts since this exporter started: exported, dropped and pending traces, and more."""
        with self._lock:
            counts: dict[str, Any] = {
                "exported_traces": 0,
                "dropped_traces": 0,
                "missing_records": 0,
                **self._stats,
            }
            counts["pending_traces"] = self._queued_traces
            counts["last_error"] = self._last_error
        return counts

    def take_unreported(self, owner: str) -> dict[str, float]:
        """The counts of `owner`'s traces not yet reported in a step, as step metrics."""
        with self._lock:
            counts = self._unreported.pop(owner, Counter())
        return {f"langfuse/{key}": float(value) for key, value in counts.items()}

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued trace is sent or dropped; False if `timeout` ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._queued_traces == 0:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def close(self, timeout: float | None = EXIT_FLUSH_SECONDS) -> None:
        """Send what is queued (up to `timeout` seconds), then stop the worker."""
        if self._closed:
            return
        flushed = self.flush(timeout)
        self._closed = True
        self._queue.put(None)
        for job in list(self._queue.queue):
            if job is not None:
                job.ready.set()  # a step that never finished must not hold the worker
        if self._thread is not None:
            self._thread.join(timeout=1.0 if flushed else 0.1)
        with self._lock:
            pending = self._queued_traces
        if pending:
            logger.warning(
                "Langfuse: %d trace(s) were still queued at exit and are not exported.", pending
            )

    # ---------------------------------------------------------------------------- the queue

    def _enqueue(self, job: ExportJob) -> bool:
        count = len(job.items)
        with self._lock:
            full = self._closed or self._queued_traces + count > self.max_queued_traces
            if not full:
                self._queued_traces += count
        if full:
            self._count(job.owner, dropped_traces=count)
            self._warn_once(
                "queue",
                f"Langfuse export queue is full ({self.max_queued_traces} traces): {count} "
                "trace(s) dropped (counted in langfuse/dropped_traces). Langfuse is probably "
                "slow or unreachable; training is unaffected.",
            )
            return False
        self._start_worker()
        self._queue.put(job)
        return True

    def _start_worker(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            from art_core.trackers.langfuse._wire import WORKER_THREAD_NAME

            self._thread = threading.Thread(
                target=self._work, name=f"{WORKER_THREAD_NAME}-{id(self):x}", daemon=True
            )
            self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._export(job)
            except Exception as error:  # export must never end the worker
                logger.exception("Langfuse export failed unexpectedly")
                uncounted = len(job.items) - job.counted
                self._fail(job.owner, uncounted, f"{type(error).__name__}: {error}")
            finally:
                with self._lock:
                    self._queued_traces -= len(job.items)

    # ----------------------------------------------------------------------------- exporting

    def _export(self, job: ExportJob) -> None:
        records = self._fetch_records(job)
        while not job.ready.wait(0.5):
            if self._closed:
                break
        now = time.time()
        traces = []
        for trajectory, context in job.items:
            advantage = job.advantages.get(trajectory.id)
            if advantage is not None:
                context = dataclasses.replace(context, advantage=advantage)
            traces.append(trace_from_trajectory(trajectory, context, records, now=now))
        missing = sum(trace.missing_records for trace in traces)
        if missing:
            self._count(job.owner, missing_records=missing)
        sender = self._get_sender()
        for start in range(0, len(traces), TRACES_PER_REQUEST):
            batch = traces[start : start + TRACES_PER_REQUEST]
            error = sender.send_spans(batch)
            if error is None:
                error = sender.send_scores(batch)
            if error is None:
                self._count(job.owner, exported_traces=len(batch))
            else:
                self._fail(job.owner, len(batch), error)
            job.counted += len(batch)

    def _fetch_records(self, job: ExportJob) -> dict[str, dict[str, Any]]:
        """The calls' records from the backend, in one request; {} when it cannot answer."""
        ids = sorted({i for trajectory, _ in job.items for i in completion_ids(trajectory)})
        if not ids or job.records_url is None:
            return {}
        headers = {"Authorization": f"Bearer {job.api_key}"} if job.api_key else {}
        records: dict[str, dict[str, Any]] = {}
        try:
            for start in range(0, len(ids), RECORDS_PER_REQUEST):
                response = httpx.post(
                    job.records_url,
                    json={"ids": ids[start : start + RECORDS_PER_REQUEST], "tokens": False},
                    headers=headers,
                    timeout=self.timeout,
                )
                response.raise_for_status()
                records.update({record["id"]: record for record in response.json()["data"]})
            return records
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            self._warn_once(
                "records",
                f"Langfuse export could not read the calls' records from the backend ({error}): "
                "traces are exported without usage, sampling parameters or timing.",
            )
            return records

    def _get_sender(self) -> Sender:
        if self._sender is None:
            self._sender = self._new_sender()
        return self._sender

    def _new_sender(self) -> Sender:
        from art_core.trackers.langfuse._wire import Sender  # langfuse and opentelemetry load here

        return Sender(
            host=self.host,
            public_key=self.public_key,
            secret_key=self._secret_key,
            environment=self.environment,
            timeout=self.timeout,
        )

    # ------------------------------------------------------------------- review read-back

    def send_before_step(self, job: ExportJob) -> str | None:
        """Send a train job's traces now, in the calling thread, without advantages (a step
        held for review: reviewers need them during the hold); the job itself still goes after
        the step and updates them. None on success, else the reason (nothing is dropped)."""
        records = self._fetch_records(job)
        now = time.time()
        traces = [trace_from_trajectory(t, c, records, now=now) for t, c in job.items]
        sender = self._new_sender()  # the worker's may be busy
        for start in range(0, len(traces), TRACES_PER_REQUEST):
            batch = traces[start : start + TRACES_PER_REQUEST]
            error = sender.send_spans(batch) or sender.send_scores(batch)
            if error is not None:
                return error
        self._count(job.owner, held_traces_sent=len(traces))
        return None

    def api_options(self) -> dict[str, Any]:
        """The arguments of `langfuse.api.LangfuseAPI` for this project, as the SDK sets them."""
        from langfuse._version import __version__ as sdk_version

        return {
            "base_url": self.host,
            "username": self.public_key,
            "password": self._secret_key,
            "x_langfuse_sdk_name": "python",
            "x_langfuse_sdk_version": sdk_version,
            "x_langfuse_public_key": self.public_key,
            "timeout": self.timeout,
        }

    # ------------------------------------------------------------------------------- counting

    def _count(self, owner: str, **counts: int) -> None:
        with self._lock:
            self._stats.update(counts)
            self._unreported.setdefault(owner, Counter()).update(counts)

    def _fail(self, owner: str, traces: int, reason: str) -> None:
        with self._lock:
            self._last_error = reason
        self._count(owner, dropped_traces=traces)
        self._warn_once(
            "send",
            f"Langfuse export to {self.host} failed ({reason}): the traces are dropped and "
            "counted (art.langfuse_stats(), step metric langfuse/dropped_traces); training is "
            "unaffected. This warning is shown once.",
        )

    def _warn_once(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        logger.warning(message)


def _snapshot(trajectory: Trajectory) -> Trajectory:
    """A copy the worker can read while the caller goes on changing the original."""
    return trajectory.model_copy(
        update={
            "messages_and_choices": list(trajectory.messages_and_choices),
            "additional_histories": [
                history.model_copy(
                    update={"messages_and_choices": list(history.messages_and_choices)}
                )
                for history in trajectory.additional_histories
            ],
            "metrics": dict(trajectory.metrics),
            "metadata": dict(trajectory.metadata),
            "logs": list(trajectory.logs),
        }
    )


LIVE_EXPORTERS: weakref.WeakSet[LangfuseExporter] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    # Traces still queued when the program ends get a bounded chance to leave.
    for exporter in list(LIVE_EXPORTERS):
        exporter.close(EXIT_FLUSH_SECONDS)
