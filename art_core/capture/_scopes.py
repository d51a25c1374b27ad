"""Capture scopes: every completion made inside `art.trajectory()` lands in one trajectory.

    async with art.trajectory() as t:      # or `with`, or `await art.trajectory(rollout())`
        await agent(question)              # any client: openai, LangChain, httpx (LiteLLM's),
        t.reward = score(...)              #   requests, aiohttp; nothing ART-specific in it
    # here t holds the conversation, the exact sampled tokens behind each assistant turn

How: a scope sets a context variable holding a fresh rollout id. The HTTP libraries are patched
once, where each sends a request (`Client.send` and `AsyncClient.send` of httpx and of httpx2,
which openai>=3 uses; `requests.Session.send`; `aiohttp.ClientSession._request`), to add the
header `x-rollout-id: <id>` to a request made in a scope when, and only when, it goes to one of
our backends (same scheme, host and port as the backend's base URL). A request to any other host
is left untouched, and so is one that already carries the header. The server records each
completion's prompt and sampled token ids under that id; when the scope exits, the trajectory is
built from those records (`GET /v1/rollouts/{id}`, `trajectory_from_records`): nothing is
re-tokenized, unlike ART, which keeps the HTTP exchanges and tokenizes them afterwards. Fields
set inside the block (reward, metrics, metadata, logs) are kept.

Which backend: `art.trajectory(model=m)` captures calls to `m`'s backend; without `model=`
(ART's form) calls to the backend of any model registered in this process.

Context variables are copied into asyncio tasks and `asyncio.to_thread` threads, so the calls of
an agent's tasks land in its scope, and concurrent scopes (one per task) never mix. Scopes nest:
a call belongs to the innermost one. `art.no_capture()` hides the enclosing scopes (a judge's
calls in a rollout, say); a scope opened inside it captures again.

Failure: an exception leaving a scope is re-raised; the run is not trained. As with
`model.rollout()`, its calls so far are kept on the exception (`error.art_trajectory`, shown by
`RolloutException.partial_trajectory`) and their records are released on the server at once.

Groups: `async with art.trajectory_group() as g:` collects each trajectory whose scope closes
inside it, in this task or in the tasks started inside it (await them inside the block). ART's
form, `await art.trajectory_group(awaitables)`, runs them concurrently under `no_capture()` and
returns the group. `g` trains as is: `await model.train([g])`.

The rollout-scoped base URL stays beside this: `backend.rollout_base_url(id)` and
`model.rollout()` record a client that can only change its base URL (another language, a stock
`ChatOpenAI` in another process) with no patching at all. The URL wins over the header when both
name a rollout. Scopes are the in-process form, for code whose client you cannot reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import logging
import weakref
from collections.abc import Awaitable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import art_core.model as model_module
from art_core._unknown_fields import check_names
from art_core.backend import Backend, new_rollout_id
from art_core.capture._http import get_records_sync, install_patches, origin
from art_core.capture._records import trajectory_from_records
from art_core.errors import (
    InvalidTrajectoryError,
    ModelNotRegisteredError,
    NoTrajectoryError,
)
from art_core.model import Model
from art_core.trajectories import RolloutException, Trajectory, TrajectoryGroup

logger = logging.getLogger("art_core.capture")

# A failed run's records are fetched and released within this; the run's own error matters more.
CLEANUP_SECONDS = 10.0


# ------------------------------------------------------------------------- the context state


@dataclass(eq=False)
class _OpenScope:
    """One open `art.trajectory()` scope: its trajectory, rollout id and the backends it saw."""

    trajectory: Trajectory
    rollout_id: str
    backends: tuple[Backend, ...] | None  # None: any remembered backend
    used: list[Backend] = field(default_factory=list)  # those a request went to, first use first
    started: datetime.datetime = field(default_factory=datetime.datetime.now)


_scopes: contextvars.ContextVar[tuple[_OpenScope, ...]] = contextvars.ContextVar(
    "art_core_trajectory_scopes", default=()
)
_groups: contextvars.ContextVar[tuple[TrajectoryGroup, ...]] = contextvars.ContextVar(
    "art_core_trajectory_groups", default=()
)

# Backends named by `art.trajectory(model=...)` (weakly: a closed backend goes away). Scopes
# without `model=` match these and those models were registered on: `_model.registered_backends`,
# filled by `Model.register()`.
_remembered: weakref.WeakSet[Any] = weakref.WeakSet()


def _known_backends() -> tuple[Backend, ...]:
    registered = model_module.registered_backends
    return (*_remembered, *(b for b in registered if b not in _remembered))


@overload
def current_trajectory(*, require: Literal[True]) -> Trajectory: ...
@overload
def current_trajectory(*, require: bool = False) -> Trajectory | None: ...
def current_trajectory(*, require: bool = False, **unknown: Any) -> Trajectory | None:
    """The trajectory of the innermost open `art.trajectory()` scope, or None outside one.

    `require=True` raises `NoTrajectoryError` instead of returning None.
    """
    check_names("art.current_trajectory()", unknown, ["require"])  # older ART said `required`
    scopes = _scopes.get()
    if scopes:
        return scopes[-1].trajectory
    if require:
        raise NoTrajectoryError(
            "No trajectory is open in this context: call this inside `async with "
            "art.trajectory():` (or `await art.trajectory(rollout())`). A thread started by "
            "hand does not inherit it: use asyncio.to_thread or contextvars.copy_context().run."
        )
    return None


@contextlib.contextmanager
def no_capture() -> Iterator[None]:
    """Hide the enclosing trajectory and group scopes: calls inside are not captured.

    A scope opened inside captures again (into itself only).
    """
    scopes, groups = _scopes.set(()), _groups.set(())
    try:
        yield
    finally:
        _groups.reset(groups)
        _scopes.reset(scopes)


# --------------------------------------------------------------------- the trajectory scope


class TrajectoryScope:
    """`with` / `async with art.trajectory()`: yields the Trajectory, filled in when it exits.

    Prefer `async with` in async code: a plain `with` fetches the records with a blocking request.
    """

    def __init__(self, model: Model | None = None) -> None:
        # Resolved now: an unregistered model, or no backend at all, fails where it is written.
        if model is not None:
            backends: tuple[Backend, ...] | None = (model.backend,)
            _remembered.add(model.backend)
        else:
            backends = None
            if not _known_backends():
                raise ModelNotRegisteredError(
                    "art.trajectory() captures calls to the backends of registered models, and "
                    "no model is registered in this process yet: `await model.register(backend)` "
                    "first, or pass art.trajectory(model=model)."
                )
        rollout_id = new_rollout_id()
        self._scope = _OpenScope(
            trajectory=Trajectory(metadata={"rollout_id": rollout_id}),
            rollout_id=rollout_id,
            backends=backends,
        )
        self._token: contextvars.Token[tuple[_OpenScope, ...]] | None = None
        self._entered = False

    @property
    def rollout_id(self) -> str:
        """The id the server records this scope's completions under."""
        return self._scope.rollout_id

    def _enter(self) -> Trajectory:
        if self._entered:
            raise RuntimeError("an art.trajectory() scope is entered once: open a new one")
        self._entered = True
        install_patches(_rollout_id_for)
        self._token = _scopes.set((*_scopes.get(), self._scope))
        return self._scope.trajectory

    def _leave(self) -> None:
        if _scopes.get()[-1:] != (self._scope,):
            raise RuntimeError("art.trajectory() scopes must exit in the order they were entered")
        assert self._token is not None
        _scopes.reset(self._token)

    def __enter__(self) -> Trajectory:
        return self._enter()

    def __exit__(self, exc_type: object, error: BaseException | None, tb: object) -> None:
        self._leave()
        with no_capture():  # our own requests belong to no enclosing scope
            records = _records_of(self._scope, error)
        _finish(self._scope, records, error)

    async def __aenter__(self) -> Trajectory:
        return self._enter()

    async def __aexit__(self, exc_type: object, error: BaseException | None, tb: object) -> None:
        self._leave()
        with no_capture():
            records = await _records_of_async(self._scope, error)
        _finish(self._scope, records, error)


def _records_of(scope: _OpenScope, error: BaseException | None) -> list[dict[str, Any]]:
    """The scope's records from the backends it used; a failed run's are also released."""
    if error is None:
        return [r for b in scope.used for r in get_records_sync(b, scope.rollout_id)]
    records: list[dict[str, Any]] = []
    try:
        for backend in scope.used:
            records += get_records_sync(backend, scope.rollout_id)
            get_records_sync(backend, scope.rollout_id, method="DELETE")
    except Exception as cleanup_error:  # noqa: BLE001 - the run's error matters more
        _cleanup_failed(scope, cleanup_error)
    return records


async def _records_of_async(scope: _OpenScope, error: BaseException | None) -> list[dict[str, Any]]:
    """`_records_of` on the event loop; a failed run's cleanup is bounded by CLEANUP_SECONDS."""
    records: list[dict[str, Any]] = []
    if error is None:
        for backend in scope.used:
            records += await backend.rollout_records(scope.rollout_id)
        return records
    try:
        for backend in scope.used:
            get, discard = backend.rollout_records, backend.discard_rollout
            records += await asyncio.wait_for(get(scope.rollout_id), CLEANUP_SECONDS)
            await asyncio.wait_for(discard(scope.rollout_id), CLEANUP_SECONDS)
    except Exception as cleanup_error:  # noqa: BLE001 - the run's error matters more
        _cleanup_failed(scope, cleanup_error)
    return records


def _finish(scope: _OpenScope, records: list[dict[str, Any]], error: BaseException | None) -> None:
    """A closed scope's end, sync or async alike: the trajectory filled, or the failure kept."""
    if error is None:
        _fill(scope, records)
    else:
        _fail(scope, records, error)


def _fill(scope: _OpenScope, records: list[dict[str, Any]]) -> None:
    """Put the recorded conversation(s) into the scope's trajectory, keeping the user's fields;
    then it joins the innermost group scope."""
    trajectory = scope.trajectory
    trajectory.metadata = {**trajectory.metadata, "rollout_id": scope.rollout_id}
    duration = (datetime.datetime.now() - scope.started).total_seconds()
    trajectory.metrics = {**trajectory.metrics, "duration": duration}  # as ART's finish() does
    if records:
        if trajectory.messages_and_choices or trajectory.additional_histories:
            raise InvalidTrajectoryError(
                f"art.trajectory() scope {scope.rollout_id}: messages_and_choices was set by "
                f"hand and {len(records)} completion(s) were captured; a captured trajectory's "
                "conversation comes from the server's records. Set only reward, metrics, "
                "metadata and logs inside the scope, or make by-hand calls under no_capture()."
            )
        built = trajectory_from_records(records, metadata={"rollout_id": scope.rollout_id})
        trajectory.messages_and_choices = built.messages_and_choices
        trajectory.tools = built.tools
        trajectory.additional_histories = built.additional_histories
        trajectory.metrics = {**trajectory.metrics, **built.metrics}
    _join_group(trajectory)


def _fail(scope: _OpenScope, records: list[dict[str, Any]], error: BaseException) -> None:
    """The run raised: keep its calls so far on `error` (for review, not training)."""
    partial = scope.trajectory
    partial.metadata = {**partial.metadata, "rollout_id": scope.rollout_id}
    if records and not partial.messages_and_choices:
        built = trajectory_from_records(records, metadata={"rollout_id": scope.rollout_id})
        partial.messages_and_choices = built.messages_and_choices
        partial.tools = built.tools
        partial.additional_histories = built.additional_histories
    error.art_trajectory = partial  # type: ignore[attr-defined]
    error.add_note(
        f"art: trajectory scope {scope.rollout_id} ended by {type(error).__name__} after "
        f"{len(records)} recorded call(s); not trained (its calls are kept on the exception)."
    )
    _join_group(error)


def _cleanup_failed(scope: _OpenScope, cleanup_error: Exception) -> None:
    # The records stay on the server until they expire (counted on its /metrics).
    logger.warning(
        "trajectory scope %s: could not release its records: %s", scope.rollout_id, cleanup_error
    )


def _join_group(item: Trajectory | BaseException) -> None:
    """Add a closed scope's trajectory (or its run's exception) to the innermost group scope."""
    groups = _groups.get()
    if not groups:
        return
    if isinstance(item, Trajectory):
        groups[-1].trajectories.append(item)
    else:
        groups[-1].exceptions.append(RolloutException.from_exception(item))


# -------------------------------------------------------------------------- the public calls


@overload
def trajectory(
    coroutine: Coroutine[Any, Any, object], /, *, model: Model | None = None
) -> Coroutine[Any, Any, Trajectory]: ...
@overload
def trajectory(*, model: Model | None = None) -> TrajectoryScope: ...
def trajectory(
    coroutine: Coroutine[Any, Any, object] | None = None,
    /,
    *,
    model: Model | None = None,
    **unknown: Any,
) -> TrajectoryScope | Coroutine[Any, Any, Trajectory]:
    """A capture scope (`with`/`async with art.trajectory() as t:`), or, given a coroutine, run it
    in one and return its trajectory (ART's `await art.trajectory(rollout())`).

    `model`: capture calls to this model's backend (default: any registered model's backend).
    """
    check_names("art.trajectory()", unknown, ["model"])
    if coroutine is None:
        return TrajectoryScope(model)
    if not isinstance(coroutine, Coroutine):
        raise TypeError(
            f"art.trajectory() takes a coroutine (`rollout(...)`, not awaited yet), got "
            f"{type(coroutine).__name__}: a Task or Future already runs in its own context"
        )
    scope = TrajectoryScope(model)
    return _run_in_scope(scope, coroutine)


async def _run_in_scope(
    scope: TrajectoryScope, coroutine: Coroutine[Any, Any, object]
) -> Trajectory:
    async with scope as captured:
        await coroutine
    return captured


class TrajectoryGroupScope:
    """`with` / `async with art.trajectory_group() as g:`: g collects the scopes closed inside."""

    def __init__(self, group: TrajectoryGroup) -> None:
        self.group = group
        self._token: contextvars.Token[tuple[TrajectoryGroup, ...]] | None = None

    def __enter__(self) -> TrajectoryGroup:
        if self._token is not None:
            raise RuntimeError("an art.trajectory_group() scope is entered once: open a new one")
        self._token = _groups.set((*_groups.get(), self.group))
        return self.group

    def __exit__(self, *exc_info: object) -> None:
        if _groups.get()[-1:] != (self.group,):
            raise RuntimeError(
                "art.trajectory_group() scopes must exit in the order they were entered"
            )
        assert self._token is not None
        _groups.reset(self._token)

    async def __aenter__(self) -> TrajectoryGroup:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__(*exc_info)


_GROUP_HINTS = {
    "logs": "art_core's TrajectoryGroup has no logs: log on each trajectory (`t.log(...)`), "
    "or put it in metadata=.",
}

GroupItem = Trajectory | BaseException | Awaitable[Trajectory]


@overload
def trajectory_group(
    trajectories: Iterable[GroupItem],
    /,
    *,
    exceptions: Iterable[BaseException | RolloutException] = (),
    metadata: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    return_exceptions: bool = False,
) -> Coroutine[Any, Any, TrajectoryGroup]: ...
@overload
def trajectory_group(
    *,
    exceptions: Iterable[BaseException | RolloutException] = (),
    metadata: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
) -> TrajectoryGroupScope: ...
def trajectory_group(
    trajectories: Iterable[GroupItem] | None = None,
    /,
    *,
    exceptions: Iterable[BaseException | RolloutException] = (),
    metadata: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    return_exceptions: bool = False,
    **unknown: Any,
) -> TrajectoryGroupScope | Coroutine[Any, Any, TrajectoryGroup]:
    """A group scope (`async with art.trajectory_group() as g:`), or, given awaitables of
    trajectories, run them concurrently and return their group (ART's awaited form).

    With `return_exceptions=True` a rollout that raised is kept in `group.exceptions`; otherwise
    the first exception cancels the others and is raised.
    """
    check_names(
        "art.trajectory_group()",
        unknown,
        ["exceptions", "metadata", "metrics", "return_exceptions"],
        hints=_GROUP_HINTS,
    )
    provided = list(exceptions)
    if trajectories is None:
        if return_exceptions:
            raise TypeError(
                "art.trajectory_group(return_exceptions=True) applies to the awaited form, "
                "`await art.trajectory_group(rollouts, return_exceptions=True)`; in a group "
                "scope, catch the exceptions in your own gather."
            )
        group = TrajectoryGroup(exceptions=provided, metadata=metadata, metrics=metrics)
        return TrajectoryGroupScope(group)
    return _gather_group(trajectories, provided, metadata, metrics, return_exceptions)


async def _gather_group(
    items: Iterable[GroupItem],
    provided: list[BaseException | RolloutException],
    metadata: dict[str, Any] | None,
    metrics: dict[str, float] | None,
    return_exceptions: bool,
) -> TrajectoryGroup:
    """Run the awaitables concurrently, isolated from enclosing scopes; keep the input order."""
    results: list[Trajectory | BaseException | asyncio.Future[Any]] = []
    tasks: dict[int, asyncio.Future[Any]] = {}  # one task per distinct awaitable
    with no_capture():
        try:
            for item in items:
                if isinstance(item, Trajectory | Exception):
                    results.append(item)
                elif isinstance(item, BaseException):
                    raise item  # KeyboardInterrupt, CancelledError: not a rollout's result
                elif isinstance(item, Awaitable):
                    if id(item) not in tasks:
                        tasks[id(item)] = asyncio.ensure_future(item)
                    results.append(tasks[id(item)])
                else:
                    raise TypeError(
                        "art.trajectory_group() takes trajectories, exceptions or awaitables of "
                        f"trajectories, got {type(item).__name__}"
                    )
            await _wait_all(list(tasks.values()), return_exceptions)
        except BaseException:
            await _cancel(tasks.values())
            raise
    values = [_result_of(result) for result in results]
    # The rollouts' own exceptions first, then those given as `exceptions=` (as ART orders them).
    return TrajectoryGroup(
        [value for value in values if isinstance(value, Trajectory)],
        exceptions=[*(value for value in values if not isinstance(value, Trajectory)), *provided],
        metadata=metadata,
        metrics=metrics,
    )


async def _wait_all(tasks: list[asyncio.Future[Any]], return_exceptions: bool) -> None:
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.cancelled():
                raise asyncio.CancelledError("a rollout of art.trajectory_group() was cancelled")
            error = task.exception()
            if error is not None and (not return_exceptions or not isinstance(error, Exception)):
                raise error


async def _cancel(tasks: Iterable[asyncio.Future[Any]]) -> None:
    unfinished = [task for task in tasks if not task.done()]
    for task in unfinished:
        task.cancel()
    await asyncio.gather(*unfinished, return_exceptions=True)


def _result_of(
    result: Trajectory | BaseException | asyncio.Future[Any],
) -> Trajectory | BaseException:
    if not isinstance(result, asyncio.Future):
        return result
    error = result.exception()
    if error is not None:
        return error
    value = result.result()
    if not isinstance(value, Trajectory):
        raise TypeError(
            "art.trajectory_group() awaitables must return an art.Trajectory, one returned "
            f"{type(value).__name__}: wrap a rollout that returns nothing as "
            "art.trajectory(rollout(...))"
        )
    return value


# ------------------------------------------------------------------ which requests are tagged


def _rollout_id_for(url: str) -> str | None:
    """The rollout id a request to `url` carries: the innermost scope's, when `url` is ours."""
    scopes = _scopes.get()
    if not scopes:
        return None  # the common case, every request outside a scope: nothing to compute
    scope = scopes[-1]
    wanted = origin(url)
    candidates = scope.backends if scope.backends is not None else _known_backends()
    for backend in candidates:
        try:
            base = backend.inference_base_url
        except Exception:  # noqa: BLE001 - a backend not started yet has no URL to match
            continue
        if origin(base) == wanted:
            if not any(used is backend for used in scope.used):
                scope.used.append(backend)
            return scope.rollout_id
    return None
