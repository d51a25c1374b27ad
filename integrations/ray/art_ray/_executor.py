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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions

from art_ray._worker import RolloutWorker

logger = logging.getLogger("art_ray")

# Ray's own failures: the worker or its node is gone, not the rollout's fault.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.ActorDiedError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OwnerDiedError,
    ray.exceptions.RaySystemError,
)

_LOST_OR_LATE: tuple[type[BaseException], ...] = (TimeoutError, *INFRASTRUCTURE_ERRORS)


class RolloutTimeoutError(TimeoutError):
    """A rollout ran past the executor's `timeout` and was cancelled on its worker."""


class WorkerStartError(RuntimeError):
    """A rollout worker died while starting, or did not start within `start_timeout`."""


_WORKER_LOST: tuple[type[BaseException], ...] = (*INFRASTRUCTURE_ERRORS, WorkerStartError)


class NoLiveWorkersError(RuntimeError):
    """Every rollout worker is gone and none could be started again."""


@dataclass
class ExecutorStats:
    """What the executor did: where rollouts ran, what was retried, what failed."""

    completed: int = 0  # calls that returned a result
    failed: int = 0  # calls that raised the rollout's own exception
    retried: int = 0  # calls sent again after Ray lost their worker
    lost: int = 0  # calls that failed on Ray's side past `infra_retries` (raised, counted)
    timed_out: int = 0
    workers_replaced: int = 0
    nodes: Counter[str] = field(default_factory=Counter)  # node id -> rollouts completed there


@dataclass(eq=False)
class _Worker:
    handle: Any  # the actor handle
    index: int
    where: Any  # the ref of its first `where()` call: node id and pid once it has started
    in_flight: int = 0
    node_id: str | None = None
    alive: bool = True

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
        resource can hang).
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
        if start_timeout <= 0:
            raise ValueError(f"start_timeout must be > 0 seconds, got {start_timeout}")
        self._started_ray = False
        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=False)
            self._started_ray = True
        self._check_resources(resources or {}, num_cpus)
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
        self.start_timeout = start_timeout
        self.replace_dead_workers = replace_dead_workers
        self.stats = ExecutorStats()
        self._actor_class = ray.remote(RolloutWorker)
        self._workers: list[_Worker] = []
        self._next_index = 0
        self._replacing: set[asyncio.Task[None]] = set()
        self._closed = False
        for _ in range(workers):
            self._workers.append(self._start_worker())

    # ---------------------------------------------------------------------------------- public

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """A coroutine that runs `fn(*args, **kwargs)` on a worker and returns its result.

        `fn` is a rollout function (sync or async) importable on the workers or picklable by
        value; `args` are pickled (a model arrives as a detached copy on the same server).
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
        """Stop the workers (and Ray, when this executor started it)."""
        self._closed = True
        for task in self._replacing:
            task.cancel()
        for worker in self._workers:
            with contextlib.suppress(Exception):
                ray.kill(worker.handle, no_restart=True)
        self._workers.clear()
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

    def _check_resources(self, resources: dict[str, float], num_cpus: float) -> None:
        """A resource no node has would leave the workers pending forever: say so now."""
        available = ray.cluster_resources()
        missing = [name for name in resources if name not in available]
        if missing:
            have = ", ".join(sorted(k for k in available if not k.startswith("node:"))) or "none"
            raise ValueError(
                f"no node in the Ray cluster has the resource(s) {', '.join(missing)} "
                f"(the cluster has: {have}); start the rollout nodes with "
                f"`ray start --resources='{{\"{missing[0]}\": 1}}'` or drop resources="
            )
        if num_cpus > available.get("CPU", 0):
            raise ValueError(
                f"num_cpus={num_cpus} per worker, but the cluster has {available.get('CPU', 0)} CPUs"
            )

    def _start_worker(self) -> _Worker:
        handle: Any = self._actor_class.options(**self._options).remote()
        worker = _Worker(handle=handle, index=self._next_index, where=handle.where.remote())
        self._next_index += 1
        return worker

    def _pick(self, avoid: set[_Worker]) -> _Worker:
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
            worker = self._pick(tried)
            tried.add(worker)
            worker.in_flight += 1
            try:
                # The deadline is the rollout's own: a worker still starting (a new process,
                # imports, a node being added) is waited for first, up to `start_timeout`.
                if worker.node_id is None and await worker.node(self.start_timeout) is None:
                    raise WorkerStartError(
                        f"rollout worker {worker.index} did not start within "
                        f"start_timeout={self.start_timeout} s (or died while starting)"
                    )
                result = await self._await(worker.handle.run.remote(fn, args, kwargs))
            except ray.exceptions.RayTaskError as error:
                self.stats.failed += 1
                raise _user_exception(error) from None
            except _WORKER_LOST as error:
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

    async def _await(self, ref: Any) -> Any:
        """Await a Ray call within the deadline; cancelled (on the worker too) past it."""
        try:
            if self.timeout is None:
                return await ref
            return await asyncio.wait_for(_awaited(ref), self.timeout)
        except TimeoutError:
            ray.cancel(ref)
            self.stats.timed_out += 1
            raise RolloutTimeoutError(
                f"the rollout took longer than timeout={self.timeout} s and was cancelled"
            ) from None
        except asyncio.CancelledError:
            ray.cancel(ref)  # the gather stopped (the exception limit, Ctrl-C): stop the rollout
            raise

    def _lost(self, worker: _Worker, error: BaseException) -> None:
        if not worker.alive:
            return
        worker.alive = False
        logger.warning("rollout worker %d died: %s", worker.index, _first_line(error))
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
            if node_id is not None and await _node_answers(node_id):
                break  # the node lives on, only the worker's process died: start it again
            await asyncio.sleep(1.0)
        if self._closed or dead not in self._workers:
            return
        self._workers[self._workers.index(dead)] = self._start_worker()
        self.stats.workers_replaced += 1


async def _awaited(ref: Any) -> Any:
    return await ref


async def _node_answers(node_id: str) -> bool:
    """Whether a fresh task pinned to the node runs there within seconds."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = _probe.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote()
    try:
        await asyncio.wait_for(_awaited(probe), 5.0)
    except (TimeoutError, ray.exceptions.RayError):
        ray.cancel(probe, force=True)
        return False
    return True


@ray.remote(num_cpus=0, max_retries=0)
def _probe() -> bool:
    return True


def _user_exception(error: ray.exceptions.RayTaskError) -> BaseException:
    """The rollout's own exception, with Ray's remote traceback attached as a note."""
    cause = error.cause
    if not isinstance(cause, BaseException):
        return error
    with contextlib.suppress(Exception):
        cause.add_note(f"raised on a Ray worker:\n{error}")
    return cause


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
