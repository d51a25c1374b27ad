"""Langfuse review read-back: what people decide in Langfuse on a held step reaches the trainer.

`LangfuseObserver(review=LangfuseReview(...))`: while a train call is held for review
(`TrainConfig(review_hold_seconds=N)`), a thread polls every `poll_seconds`:

1. the server's held steps (`GET <server>/review/<project>/<model>/pending`) until one holds
   this call's trajectories; then it sends their traces at once (they otherwise leave after
   the step, with advantages, and reviewers need them now) and, with `annotation_queue=`, adds
   each trace to that Langfuse annotation queue (`POST /api/public/annotation-queues/{id}/items`);
2. that queue's items (`GET /api/public/annotation-queues/{id}/items`);
3. the traces' scores (`GET /api/public/v3/scores?traceId=...&name=...`, the SDK's
   `scores.get_many`): the latest `veto_score` of a trace, when true (non-zero, `true`, or
   "true"/"yes"/"veto"), flags its trajectory, and a false one after it withdraws that flag;
   the latest `reward_score` (a finite number) overrides its reward;
4. posts each new decision to the review page's own route (`POST .../steps/_pending/<id>/
   decisions` with `source=langfuse`) and, once every queue item of the step is COMPLETED (read
   before the scores, so a score set before completing is never missed), the approval (`POST
   .../pending/<id>/approve`), which releases the hold at once. PENDING items keep it held
   until someone approves on the page or the hold expires.

Why the client reads Langfuse, not the server: the client already holds the Langfuse keys and
knows the trace ids it exported; the server never sees Langfuse keys, and the decisions go
through the page's validation and file, so they count in the same `review/*` metrics and show
in the same log, with their source.

Conflicts: the latest decision in the decisions file wins, whatever its source. A Langfuse score
is posted once per (score id, value), so a page decision made after it stands until that score
changes in Langfuse.

Failures never stop training: Langfuse or the server unreachable, a wrong key, an unknown queue
give one warning and a count per failed poll (`langfuse/review_read_errors`, in `stats()` and the
model's next step metrics); the hold then goes on as it would without Langfuse.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import httpx

from art_core._observers import ObservedModel
from art_core.errors import LangfuseConfigError, ReviewReadError
from art_core.trackers.langfuse._trace import trace_id_for
from art_core.trajectories import Trajectory

logger = logging.getLogger("art_core.langfuse")

EXPORTED_SCORES = ("reward", "ruler_score")  # what the export itself writes on each trace
TRUE_WORDS = {"true", "yes", "veto", "flag", "1"}
TRACES_PER_READ = 50  # trace ids per scores request (a comma-separated query parameter)
SCORES_PER_PAGE = 100  # the API's maximum
QUEUE_ITEMS_PER_PAGE = 100
SOURCE = "langfuse"


@dataclass(frozen=True)
class LangfuseReview:
    """Which Langfuse scores and queue decide for a held step (see the module docstring).

    `veto_score`: a score name whose true value flags the trajectory; `reward_score`: a score
    name whose number replaces its reward (None: not read); `annotation_queue`: a queue id
    whose completed items approve the held step; `server_url`: the art-server (default: the
    model's backend).
    """

    veto_score: str = "art_veto"
    reward_score: str | None = "art_reward"
    annotation_queue: str | None = None
    poll_seconds: float = 1.0
    server_url: str | None = None

    def __post_init__(self) -> None:
        for name in (self.veto_score, self.reward_score):
            if name in EXPORTED_SCORES:
                raise LangfuseConfigError(
                    f"LangfuseReview: {name!r} is a score the export itself writes on every "
                    "trace; name the review's scores otherwise (e.g. 'art_veto', 'art_reward')."
                )
        if self.poll_seconds <= 0:
            raise LangfuseConfigError("LangfuseReview: poll_seconds must be above 0.")


@dataclass(frozen=True)
class Score:
    """One Langfuse score on a trace, as the review reads it."""

    id: str
    trace_id: str
    name: str
    value: float | bool | str
    timestamp: float
    comment: str | None = None
    author: str | None = None


@dataclass(frozen=True)
class LangfuseDecision:
    """A decision for the review page's route; `version` says which score made it."""

    action: str  # the page form's: flag_trajectory, override_reward, withdraw_trajectory
    trajectory_id: str
    reason: str
    version: str
    who: str | None = None
    reward: float | None = None

    def form(self) -> dict[str, str]:
        fields = {
            "action": self.action,
            "trajectory_id": self.trajectory_id,
            "reason": self.reason,
            "source": SOURCE,
            "who": self.who or "langfuse",
        }
        if self.reward is not None:
            fields["reward"] = repr(self.reward)
        return fields


def is_veto(value: float | bool | str) -> bool:
    """A veto score's value: non-zero numbers, true, and "true"/"yes"/"veto"/"flag" veto."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


def decisions_from_scores(
    scores: Iterable[Score],
    trajectories: Mapping[str, str],
    review: LangfuseReview,
    posted: Mapping[tuple[str, str], str],
) -> list[LangfuseDecision]:
    """The decisions these scores ask for that were not posted yet.

    `trajectories` maps trace id to trajectory id; `posted` maps (trajectory id, kind) to the
    version last posted ("veto" or "reward"). The latest score of a name on a trace counts.
    """
    latest: dict[tuple[str, str], Score] = {}
    for score in scores:
        key = (score.trace_id, score.name)
        if score.trace_id in trajectories and (
            key not in latest or score.timestamp >= latest[key].timestamp
        ):
            latest[key] = score
    decisions = []
    for (trace_id, name), score in sorted(latest.items()):
        trajectory_id = trajectories[trace_id]
        version = f"{score.id}:{score.value!r}"
        said = f"Langfuse score {name} = {score.value}" + (
            f": {score.comment}" if score.comment else ""
        )
        if name == review.veto_score:
            flagged_before = (trajectory_id, "veto") in posted
            if posted.get((trajectory_id, "veto")) == version:
                continue
            if is_veto(score.value):
                action = "flag_trajectory"
            elif flagged_before:
                action = "withdraw_trajectory"
            else:
                continue
            decisions.append(
                LangfuseDecision(action, trajectory_id, said, version, who=score.author)
            )
        elif name == review.reward_score and posted.get((trajectory_id, "reward")) != version:
            if isinstance(score.value, bool) or not isinstance(score.value, int | float):
                continue
            if not math.isfinite(score.value):
                continue
            decisions.append(
                LangfuseDecision(
                    "override_reward",
                    trajectory_id,
                    said,
                    version,
                    who=score.author,
                    reward=float(score.value),
                )
            )
    # A withdrawal also clears the reward override: it goes first, the override after it.
    return sorted(decisions, key=lambda decision: decision.action != "withdraw_trajectory")


class HeldJob(Protocol):
    """What the read-back reads of a train call's export job (`_exporter.ExportJob`)."""

    @property
    def items(self) -> list[tuple[Trajectory, Any]]: ...
    @property
    def owner(self) -> str: ...


class ReviewExporter(Protocol):
    """What the read-back uses of its `LangfuseExporter`: its keys, sending and counting."""

    timeout: float

    def send_before_step(self, job: Any) -> str | None: ...
    def api_options(self) -> dict[str, Any]: ...
    def _count(self, owner: str, **counts: int) -> None: ...
    def _warn_once(self, kind: str, message: str) -> None: ...


class HeldStepReview:
    """The thread that carries Langfuse decisions to one train call's held step."""

    def __init__(
        self,
        exporter: ReviewExporter,
        review: LangfuseReview,
        model: ObservedModel,
        job: HeldJob,
    ) -> None:
        self.exporter = exporter
        self.review = review
        self.job = job
        self.owner = job.owner
        server = review.server_url or (model.inference_base_url or "").removesuffix("/v1")
        self.review_url = f"{server.rstrip('/')}/review/{model.project}/{model.name}"
        api_key = model.inference_api_key
        self.headers = {"Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.trajectories = {
            trace_id_for(trajectory.id): trajectory.id for trajectory, _ in job.items
        }
        self.posted: dict[tuple[str, str], str] = {}
        self.stop = threading.Event()
        from art_core.trackers.langfuse._wire import WORKER_THREAD_NAME

        self.thread = threading.Thread(
            target=self._run, name=f"{WORKER_THREAD_NAME}-review-{id(self):x}", daemon=True
        )
        self.thread.start()

    def finished(self) -> None:
        """The train call is over: stop polling."""
        self.stop.set()

    # --------------------------------------------------------------------------------- loop

    def _run(self) -> None:
        held: dict[str, Any] | None = None
        api = None
        while not self.stop.wait(self.review.poll_seconds):
            try:
                if held is None:
                    held = self._held_step()
                    if held is None:
                        continue
                    api = self._api()
                    self._hand_over(api, held)
                if time.time() > held["expires_at"] + self.review.poll_seconds:
                    return  # released: later decisions could not apply to this step
                assert api is not None
                if self._poll(api, held):
                    return  # approved
            except ReviewReadError as error:
                self.exporter._count(self.owner, review_read_errors=1)
                self.exporter._warn_once(
                    "review",
                    f"Langfuse review read-back failed ({error}): decisions made in Langfuse "
                    "are not applied while this lasts (counted in langfuse/review_read_errors); "
                    "the held step is released by the review page or its hold as usual, and "
                    "training goes on. This warning is shown once.",
                )
            except Exception:  # the read-back must never end in an unhandled thread error
                logger.exception("Langfuse review read-back failed unexpectedly")
                return

    def _held_step(self) -> dict[str, Any] | None:
        """The server's held step that holds this call's trajectories, if any yet."""
        answer = self._server("GET", "/pending")
        ours = set(self.trajectories.values())
        for pending in answer.get("pending", []):
            if ours & set(pending.get("trajectory_ids", [])):
                return dict(pending)
        return None

    def _hand_over(self, api: Any, held: dict[str, Any]) -> None:
        """The step is held: its traces go to Langfuse now, and into the queue if one is set."""
        error = self.exporter.send_before_step(self.job)
        if error is not None:
            raise ReviewReadError(f"sending the held step's traces: {error}")
        queue = self.review.annotation_queue
        if queue is None:
            return
        queued = {item.object_id for item in self._queue_items(api, queue)}
        for trace_id in self.trajectories:
            if trace_id not in queued:
                self._langfuse(
                    api.annotation_queues.create_queue_item,
                    queue,
                    object_id=trace_id,
                    object_type="TRACE",
                )

    def _poll(self, api: Any, held: dict[str, Any]) -> bool:
        """One round: queue status, scores, decisions posted; True once the step is approved."""
        completed = False
        if self.review.annotation_queue is not None:
            items = [
                item
                for item in self._queue_items(api, self.review.annotation_queue)
                if item.object_id in self.trajectories
            ]
            completed = bool(items) and all(str(item.status) == "COMPLETED" for item in items)
        scores = self._scores(api)
        where = f"/steps/_pending/{held['id']}/decisions"
        for decision in decisions_from_scores(scores, self.trajectories, self.review, self.posted):
            self._server("POST", where, decision.form())
            kind = "reward" if decision.action == "override_reward" else "veto"
            if decision.action == "withdraw_trajectory":
                self.posted.pop((decision.trajectory_id, "reward"), None)
            self.posted[(decision.trajectory_id, kind)] = decision.version
            self.exporter._count(self.owner, review_decisions=1)
        if completed:
            reason = f"every item of Langfuse annotation queue {self.review.annotation_queue}"
            form = {"source": SOURCE, "who": "langfuse", "reason": reason + " is completed"}
            self._server("POST", f"/pending/{held['id']}/approve", form)
            self.exporter._count(self.owner, review_approvals=1)
        return completed

    # ---------------------------------------------------------------------------- the wire

    def _api(self) -> Any:
        from langfuse.api import LangfuseAPI

        return LangfuseAPI(**self.exporter.api_options())

    def _langfuse(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        from langfuse.api.core import ApiError
        from pydantic import ValidationError

        try:
            return call(*args, **kwargs, request_options={"max_retries": 0})
        except ApiError as error:
            raise ReviewReadError(f"Langfuse answered HTTP {error.status_code}") from error
        except (httpx.HTTPError, ValidationError) as error:
            raise ReviewReadError(f"Langfuse: {type(error).__name__}: {error}") from error

    def _scores(self, api: Any) -> list[Score]:
        names = ",".join(
            name for name in (self.review.veto_score, self.review.reward_score) if name
        )
        trace_ids = sorted(self.trajectories)
        scores = []
        for start in range(0, len(trace_ids), TRACES_PER_READ):
            cursor = None
            while True:
                page = self._langfuse(
                    api.scores.get_many,
                    trace_id=",".join(trace_ids[start : start + TRACES_PER_READ]),
                    name=names,
                    fields="details,subject,annotation",
                    limit=SCORES_PER_PAGE,
                    cursor=cursor,
                )
                scores += [s for item in page.data if (s := _score(item)) is not None]
                cursor = page.meta.cursor
                if not cursor:
                    break
        return scores

    def _queue_items(self, api: Any, queue: str) -> list[Any]:
        items, page = [], 1
        while True:
            answer = self._langfuse(
                api.annotation_queues.list_queue_items,
                queue,
                page=page,
                limit=QUEUE_ITEMS_PER_PAGE,
            )
            items += answer.data
            if page >= answer.meta.total_pages:
                return items
            page += 1

    def _server(self, method: str, path: str, form: dict[str, str] | None = None) -> Any:
        try:
            response = httpx.request(
                method,
                self.review_url + path,
                data=form,
                headers=self.headers,
                timeout=self.exporter.timeout,
            )
        except httpx.HTTPError as error:
            raise ReviewReadError(f"the server's review page: {error}") from error
        if response.status_code >= 400:
            raise ReviewReadError(
                f"the server's review page answered {response.status_code} to {method} "
                f"{path}: {response.text[:200]}"
            )
        return response.json()


def _score(item: Any) -> Score | None:
    """An SDK `ScoreV3` as a `Score`; None for a score on no trace (a session's)."""
    subject = getattr(item, "subject", None)
    trace_id = getattr(subject, "trace_id", None) or (
        subject.id if subject is not None and subject.kind == "trace" else None
    )
    if trace_id is None:
        return None
    timestamp: datetime = item.timestamp
    return Score(
        id=item.id,
        trace_id=trace_id,
        name=item.name,
        value=item.value,
        timestamp=timestamp.timestamp(),
        comment=item.comment,
        author=item.author_user_id,
    )
