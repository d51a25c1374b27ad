"""`RayExecutor`: the user's rollouts on a Ray cluster, awaited in the user's own loop.

    executor = RayExecutor(workers=4)                       # or address="auto"
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(executor.run(rollout, model, s) for _ in range(8)) for s in scenarios),
        max_exceptions=0.1,
    )
    await model.train(groups)

`run` returns a coroutine, so everything a gather does (the bar, `max_exceptions`, `after_each`
judges, group order) happens in the driver exactly as without Ray. Each call goes to the live
worker with the fewest calls in flight.

Two kinds of failure, told apart:
- the rollout raised: the same exception (type, message and attributes; Ray's remote traceback as
  a note) is raised in the driver, so the gather keeps it as the rollout's `RolloutException`
  and counts it against `max_exceptions`;
- Ray lost the worker (its process or node died): the call is sent again to another live worker,
  up to `infra_retries` times, and the dead worker is replaced once Ray has marked its node dead
  (a replacement started earlier can land on the dying node). Past the limit, the Ray error is
  raised and counted like any failed rollout. A retried rollout sends its requests again; the
  server keeps the abandoned completions' records, and nothing trains on them (only completions
  named by returned trajectories are trained).

Every call has a deadline (`timeout`): a rollout past it is cancelled on its worker and raises
`RolloutTimeoutError`, so a lost resource never hangs a gather.

A rollout cannot poison its worker (see `art_ray._worker`):
- its `SystemExit` or `KeyboardInterrupt` arrives as `RolloutExitError`, a failure like any other;
- a plain `def` rollout runs on a thread of the worker, so its blocking calls leave the worker's
  event loop free;
- while a worker has calls in flight, its loop is asked every `heartbeat` seconds to answer; a
  loop that does not answer within `heartbeat` is held by a sync call in an `async def` rollout
  (`time.sleep`, CPU work without `await`). That call fails with `RolloutBlockedError`, the worker
  is killed and a fresh one started in its place, and its other calls are sent to other workers
  (counted `retried`, not against `infra_retries`: they did nothing wrong);
- a call past its `timeout` is the rollout's fault only if its worker's loop could run it: the
  loop is asked first, and when another call holds it, that call is the one that fails (as
  above) and this one is sent elsewhere with a fresh deadline. A loop held for an unknown reason
  (no call of ours on its stack, the process frozen) is a lost worker: its calls are retried as
  when Ray loses one;
- a worker whose call ran past `timeout` is replaced too: its cancelled rollout may still hold
  one of its threads. It takes no new calls and is killed once its other calls are done.

`shutdown()` ends the calls still in flight with `ExecutorShutdownError` (counted `cancelled`).
`stats` counts every call once: `completed`, `failed` (the rollout's fault: its exception, its
deadline, a blocked loop), `lost` (Ray's fault, past the retries) or `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions

from art_ray._cluster import check_resources, join, node_answers
from art_ray._errors import (
    INFRASTRUCTURE_ERRORS,
    ExecutorShutdownError,
    NoLiveWorkersError,
    RolloutBlockedError,
    RolloutTimeoutError,
    WorkerStartError,
    first_line,
    user_exception,
)
from art_ray._stats import ExecutorStats
from art_ray._worker import HEALTH_GROUP, RolloutWorker

logger = logging.getLogger("art_ray")

_LOST_OR_LATE: tuple[type[BaseException], ...] = (TimeoutError, *INFRASTRUCTURE_ERRORS)
_WORKER_LOST: tuple[type[BaseException], ...] = (*INFRASTRUCTURE_ERRORS, WorkerStartError)

# Seconds a worker's `health` call may take past its own patience before the worker counts as
# unresponsive as a whole (its process frozen, not only its rollouts' loop).
HEALTH_GRACE = 10.0


@dataclass(eq=False)
class _Worker:
    handle: Any  # the actor handle
    index: int
    where: Any  # the ref of its first `where()` call: node id and pid once it has started
    in_flight: int = 0
    node_id: str | None = None
    alive: bool = True  # takes new calls
    retired: bool = False  # replaced (blocked or timed out): killed once its calls are done
    killed: bool = False
    calls: dict[int, asyncio.Future[None]] = field(default_factory=dict)  # id -> its verdict
    check: asyncio.Future[bool] | None = None  # the health check under way, shared by its askers

    async def node(self, patience: float | None = 30.0) -> str | None:
        """The worker's node id once it has started (None: it died first, or took longer than
        `patience` seconds to start)."""
        if self.node_id is None:
            try:
                answer = await asyncio.wait_for(_awaited(self.where), patience)
            except _LOST_OR_LATE:
                return None
            self.node_id = answer["node_id"]
        return self.node_id


class RayExecutor:
    """Runs rollout functions in async worker actors on a Ray cluster (see the module doc).

    workers: how many worker actors to start (spread over the nodes).
    address: the cluster to join when Ray is not initialised yet (`"auto"`: the running one;
        None: a local one-machine Ray). An already initialised Ray is used as it is.
    max_concurrency: rollouts one worker runs at once (more wait on the worker).
    resources: Ray resources each worker needs, e.g. `{"art_rollout": 1}` to place workers only
        on nodes started with that custom resource. Workers take no CPU by default: rollouts wait
        on the network and on their tools; give `num_cpus` for CPU-bound environments.
    infra_retries: how often a call whose worker Ray lost is sent to another worker.
    timeout: seconds one rollout may take once its worker runs (None: no deadline; then a lost
        resource can hang). A worker whose rollout ran past it is replaced; a rollout that could
        not run because another one held its worker's loop is sent elsewhere instead.
    heartbeat: seconds a busy worker's event loop may go without answering before the rollout
        holding it fails and the worker is replaced (None: not watched, and a blocked loop's
        other rollouts run into their deadlines).
    start_timeout: seconds to wait for a new worker to start (its process, its imports);
        past it the worker counts as lost, like a dead one.
    runtime_env: Ray's runtime environment for the workers (env vars, pip packages, code).
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        address: str | None = None,
        max_concurrency: int = 256,
        num_cpus: float = 0,
        resources: dict[str, float] | None = None,
        infra_retries: int = 1,
        timeout: float | None = 3600.0,
        heartbeat: float | None = 10.0,
        start_timeout: float = 300.0,
        runtime_env: dict[str, Any] | None = None,
        replace_dead_workers: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if infra_retries < 0:
            raise ValueError(f"infra_retries must be >= 0, got {infra_retries}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        if heartbeat is not None and heartbeat <= 0:
            raise ValueError(f"heartbeat must be > 0 seconds or None, got {heartbeat}")
        if start_timeout <= 0:
            raise ValueError(f"start_timeout must be > 0 seconds, got {start_timeout}")
        self._started_ray = False
        if not ray.is_initialized():
            join(address)  # a token the cluster refuses raises RayAuthenticationError
            self._started_ray = True
        check_resources(resources or {}, num_cpus)
        self._options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "max_concurrency": max_concurrency,
            "max_restarts": 0,  # a dead worker is replaced by a new one, see _replace
            "scheduling_strategy": "SPREAD",
        }
        if resources:
            self._options["resources"] = dict(resources)
        if runtime_env:
            self._options["runtime_env"] = runtime_env
        self.infra_retries = infra_retries
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.start_timeout = start_timeout
        self.replace_dead_workers = replace_dead_workers
        self.stats = ExecutorStats()
        # `health` and `where` answer on a loop of their own, beside the rollouts' loop.
        # (Ray's stubs omit the option; `.options()` refuses it, so it goes to `ray.remote`.)
        remote: Any = ray.remote
        self._actor_class = remote(concurrency_groups={HEALTH_GROUP: 4})(RolloutWorker)
        self._workers: list[_Worker] = []
        self._retiring: set[_Worker] = set()  # replaced, killed once their calls are done
        self._next_index = 0
        self._call_ids = itertools.count()
        self._replacing: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False
        for _ in range(workers):
            self._workers.append(self._start_worker())

    # ---------------------------------------------------------------------------------- public

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """A coroutine that runs `fn(*args, **kwargs)` on a worker and returns its result.

        `fn` is a rollout function importable on the workers or picklable by value: an
        `async def` runs on the worker's event loop, a plain `def` on a thread of the worker;
        `args` are pickled (a model arrives as a detached copy on the same server).
        """
        if self._closed:
            raise RuntimeError("this RayExecutor is shut down; create a new one")
        if not callable(fn):
            raise TypeError(f"RayExecutor.run needs a rollout function, got {type(fn).__name__}")
        return self._run(fn, args, kwargs)

    @property
    def workers(self) -> int:
        """Live worker actors now."""
        return sum(1 for worker in self._workers if worker.alive)

    async def where(self) -> list[dict[str, Any]]:
        """Node id and process id of each live worker (waits until they have started); a worker
        found dead is left out and replaced, as when a rollout finds it dead."""
        live = [worker for worker in self._workers if worker.alive]
        answers = await asyncio.gather(
            *(_awaited(worker.handle.where.remote()) for worker in live), return_exceptions=True
        )
        found = []
        for worker, answer in zip(live, answers, strict=True):
            if isinstance(answer, INFRASTRUCTURE_ERRORS):
                self._lost(worker, answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                found.append(answer)
        return found

    def shutdown(self) -> None:
        """Stop the workers (and Ray, when this executor started it). Calls still in flight
        raise `ExecutorShutdownError` in their callers and count as `cancelled`."""
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
        for task in self._replacing:
            task.cancel()
        for worker in [*self._workers, *self._retiring]:
            if worker.check is not None:
                worker.check.cancel()
        for worker in [*self._workers, *self._retiring]:
            for verdict in worker.calls.values():
                _settle(
                    verdict,
                    ExecutorShutdownError(
                        "the RayExecutor was shut down while this rollout was in flight"
                    ),
                )
            self._kill(worker)
        self._workers.clear()
        self._retiring.clear()
        if self._started_ray:
            ray.shutdown()

    async def __aenter__(self) -> RayExecutor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------------------- internals

    def _start_worker(self) -> _Worker:
        handle: Any = self._actor_class.options(**self._options).remote()
        worker = _Worker(handle=handle, index=self._next_index, where=handle.where.remote())
        self._next_index += 1
        return worker

    def _pick(self, avoid: set[_Worker]) -> _Worker:
        if self._closed:
            raise ExecutorShutdownError("the RayExecutor was shut down while this rollout waited")
        live = [w for w in self._workers if w.alive and w not in avoid] or [
            w for w in self._workers if w.alive
        ]
        if not live:
            if not self.replace_dead_workers:
                raise NoLiveWorkersError(
                    "every Ray rollout worker died; create a new RayExecutor "
                    "(or pass replace_dead_workers=True)"
                )
            # None left: start them again now (Ray places them on the nodes it still has).
            logger.warning("every rollout worker died; starting %d new ones", len(self._workers))
            count = len(self._workers)
            self._workers = [self._start_worker() for _ in range(count)]
            self.stats.workers_replaced += count
            live = list(self._workers)
        return min(live, key=lambda w: (w.in_flight, w.index))

    async def _run(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tried: set[_Worker] = set()
        attempt = 0
        while True:
            try:
                worker = self._pick(tried)
            except ExecutorShutdownError:
                self.stats.cancelled += 1
                raise
            tried.add(worker)
            worker.in_flight += 1
            self._watch()
            try:
                # The deadline is the rollout's own: a worker still starting (a new process,
                # imports, a node being added) is waited for first, up to `start_timeout`.
                if worker.node_id is None and await worker.node(self.start_timeout) is None:
                    raise WorkerStartError(
                        f"rollout worker {worker.index} did not start within "
                        f"start_timeout={self.start_timeout} s (or died while starting)"
                    )
                result = await self._call(worker, fn, args, kwargs)
            except ray.exceptions.RayTaskError as error:
                self.stats.failed += 1
                raise user_exception(error) from None
            except (RolloutTimeoutError, RolloutBlockedError):
                self.stats.failed += 1
                raise
            except ExecutorShutdownError:
                self.stats.cancelled += 1
                raise
            except _NeighbourBlocked:
                self.stats.retried += 1  # not against infra_retries: the rollout is innocent
                continue
            except _WORKER_LOST as error:
                if self._closed:
                    self.stats.cancelled += 1
                    raise ExecutorShutdownError(
                        "the RayExecutor was shut down while this rollout was in flight"
                    ) from error
                self._lost(worker, error)
                if attempt >= self.infra_retries:
                    self.stats.lost += 1
                    raise
                attempt += 1
                self.stats.retried += 1
                logger.warning(
                    "rollout worker %d lost (%s); sending the rollout to another worker "
                    "(retry %d of %d)",
                    worker.index,
                    type(error).__name__,
                    attempt,
                    self.infra_retries,
                )
                continue
            finally:
                worker.in_flight -= 1
            self.stats.completed += 1
            self.stats.nodes[await worker.node() or "unknown"] += 1
            return result

    async def _call(
        self, worker: _Worker, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """One call on a started worker, ended by its answer, its deadline, or a verdict (the
        health check's `RolloutBlockedError` or `_NeighbourBlocked`, `shutdown`'s
        `ExecutorShutdownError`). A deadline counts only where the worker's loop answers."""
        call_id = next(self._call_ids)
        verdict: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        worker.calls[call_id] = verdict
        ref = worker.handle.run.remote(call_id, fn, args, kwargs)
        answer = asyncio.ensure_future(_awaited(ref))
        try:
            await asyncio.wait(
                {answer, verdict}, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
            )
            # Past the deadline: the rollout's fault only if the worker's loop could run it.
            if not (answer.done() or verdict.done()) and await self._loop_held(worker):
                # The worker is killed: a verdict (blocked, or moved) or Ray's word follows.
                await asyncio.wait(
                    {answer, verdict}, timeout=HEALTH_GRACE, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            worker.calls.pop(call_id, None)
            if not answer.done() or verdict.done():
                _cancel(ref)  # past the deadline, given a verdict, or the caller was cancelled
                _discard(answer)
            if worker.retired and not worker.calls:
                self._kill(worker)
        if verdict.done():
            raise verdict.exception() or RuntimeError("a verdict without an error")
        if answer.done():
            return answer.result()
        self.stats.timed_out += 1
        self._retire(worker, f"a rollout ran past timeout={self.timeout} s")
        raise RolloutTimeoutError(
            f"the rollout took longer than timeout={self.timeout} s and was cancelled; its "
            "worker was replaced"
        )

    def _watch(self) -> None:
        """Start the heartbeat watcher on this loop unless it runs already."""
        if self.heartbeat is None or self._closed:
            return
        running = self._watcher
        if running is not None and not running.done():
            if running.get_loop() is asyncio.get_running_loop():
                return
            running.cancel()
        self._watcher = asyncio.ensure_future(self._watch_busy_workers(self.heartbeat))

    async def _watch_busy_workers(self, heartbeat: float) -> None:
        """Every `heartbeat` seconds, ask each worker with calls in flight whether its loop
        answers; ends when no call is in flight (the next `run` starts it again)."""
        while not self._closed:
            await asyncio.sleep(heartbeat)
            every = [*self._workers, *self._retiring]
            if not any(worker.in_flight for worker in every):
                return
            busy = [w for w in every if w.calls and not w.killed]
            await asyncio.gather(*(self._loop_held(worker, heartbeat) for worker in busy))

    async def _loop_held(self, worker: _Worker, heartbeat: float | None = None) -> bool:
        """Whether the worker's loop went `heartbeat` seconds without answering (then the worker
        is killed and its calls settled, see `_check`). One check per worker at a time: the
        watcher and the calls past their deadline share it."""
        heartbeat = heartbeat or self.heartbeat
        if heartbeat is None or worker.killed:
            return False
        check = worker.check
        if check is None or check.done():
            check = worker.check = asyncio.ensure_future(self._check(worker, heartbeat))
        await asyncio.wait({check})  # a caller's cancellation leaves the others' check running
        return not check.cancelled() and check.exception() is None and check.result()

    async def _check(self, worker: _Worker, heartbeat: float) -> bool:
        ref = worker.handle.health.remote(heartbeat)
        try:
            answer = await asyncio.wait_for(_awaited(ref), heartbeat + HEALTH_GRACE)
        except TimeoutError:
            _cancel(ref)
            answer = {"answers": False, "blocking": None}  # the whole process is stuck
        except ray.exceptions.RayError:
            return False  # the worker is gone: its calls see it and are sent elsewhere
        if answer["answers"] or worker.killed or not worker.calls or self._closed:
            return False
        blocking = answer["blocking"]
        for call_id, verdict in worker.calls.items():
            if verdict.done():
                continue
            if call_id == blocking:
                self.stats.blocked += 1
                verdict.set_exception(
                    RolloutBlockedError(
                        f"the rollout held its Ray worker's event loop for more than "
                        f"heartbeat={heartbeat} s: a sync call without `await` in an `async def` "
                        "rollout (time.sleep, CPU work, blocking I/O). Move it to a thread with "
                        "`await asyncio.to_thread(...)`, or make the rollout a plain `def` (run "
                        "on a thread); the worker was replaced"
                    )
                )
            elif blocking is not None:
                verdict.set_exception(_NeighbourBlocked())  # sent to another worker
        # Unknown holder: the calls see the worker die and are retried as on a lost worker.
        culprit = (
            "by an unknown call"
            if blocking is None
            else "by a rollout, which fails; its other rollouts go to other workers"
        )
        self._retire(worker, f"its event loop was held for over {heartbeat} s {culprit}")
        self._kill(worker)
        return True

    def _retire(self, worker: _Worker, reason: str) -> None:
        """Take the worker out of rotation and start a fresh one in its place; the old one is
        killed once its calls are done (`_call`) or at once (`_check`)."""
        if worker.retired:
            return
        worker.retired = True
        worker.alive = False
        logger.warning("replacing rollout worker %d: %s", worker.index, reason)
        if worker in self._workers and not self._closed:
            self._workers[self._workers.index(worker)] = self._start_worker()
            self.stats.workers_replaced += 1
        self._retiring.add(worker)
        if not worker.calls:
            self._kill(worker)

    def _kill(self, worker: _Worker) -> None:
        if worker.killed:
            return
        worker.killed = True
        worker.alive = False
        self._retiring.discard(worker)
        with contextlib.suppress(Exception):
            ray.kill(worker.handle, no_restart=True)

    def _lost(self, worker: _Worker, error: BaseException) -> None:
        if not worker.alive:
            return
        worker.alive = False
        logger.warning("rollout worker %d died: %s", worker.index, first_line(error))
        if self.replace_dead_workers and not self._closed:
            task = asyncio.ensure_future(self._replace(worker))
            self._replacing.add(task)
            task.add_done_callback(self._replacing.discard)

    async def _replace(self, dead: _Worker, patience: float = 60.0) -> None:
        """Start a worker in the dead one's place once Ray has marked its node dead, or at
        once when the node lives on (only the worker's process died); `patience` at most."""
        node_id = await dead.node()
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            alive = {node["NodeID"]: node["Alive"] for node in ray.nodes()}
            if node_id is not None and not alive.get(node_id, False):
                break  # the node is gone: SPREAD places the new worker elsewhere
            if node_id is not None and await node_answers(node_id):
                break  # the node lives on, only the worker's process died: start it again
            await asyncio.sleep(1.0)
        if self._closed or dead not in self._workers:
            return
        self._workers[self._workers.index(dead)] = self._start_worker()
        self.stats.workers_replaced += 1


class _NeighbourBlocked(Exception):
    """Another call held this call's worker loop: the call is sent to another worker."""


async def _awaited(ref: Any) -> Any:
    return await ref


def _cancel(ref: Any) -> None:
    """Cancel a Ray call (on the worker too); its worker may be gone already."""
    with contextlib.suppress(Exception):
        ray.cancel(ref)


def _discard(task: asyncio.Future[Any]) -> None:
    """Stop waiting for a task, its outcome read so that asyncio does not log it."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


def _settle(verdict: asyncio.Future[None], error: BaseException) -> None:
    """Fail a call's verdict from any thread (shutdown may run off the loop)."""

    def settle() -> None:
        if not verdict.done():
            verdict.set_exception(error)

    loop = verdict.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        settle()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(settle)
