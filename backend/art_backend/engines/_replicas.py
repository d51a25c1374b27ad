"""Engine replicas: one `Engine` over N engines that each hold the whole model.

Our server stays in front (it renders, tokenizes and records every completion, so records stay
in one place whichever replica answered); the set only decides where each request decodes:

  routing     `sticky` (the default): a request that names a session (its rollout id) goes to
              the replica that served that session before, so a rollout's turns meet their own
              prefix in that replica's cache (vLLM's prefix caching); a new session, and a
              request without one, goes to the replica with the fewest rows in flight (ties
              rotate). `least`: always the fewest in flight. `random`: uniformly at random
              (the benchmark's baseline).
  adapters    `load_adapter` loads on every live replica (in parallel) and serves the name only
              once all have it; if one refuses, the name is unloaded everywhere and the error
              raised, so no replica ever serves weights the others lack. `unload_adapter`
              withdraws the name first, then unloads it on every replica.
  health      a monitor thread reads each replica's `failure()` (and, for a replica in another
              process or on another host, a probe of its /health: three failures in a row) every
              `health_interval` seconds. A replica that fails is taken out: its requests in
              flight finish with an error naming the replica and why, new requests (sessions
              that were sticky to it included) go to the others, and the set fails only when
              none is left. One whose engine failed stays out; one taken out by its probe alone
              (a cut link, a server restarting) is probed on, and once /health answers again it
              is sent every adapter served now, told to drop the others, and taken back.
  training    when replica 0 is a `TrainableEngine`, so is the set (`replica_set` builds a
              `TrainableReplicaSet`): the trainer borrows replica 0's model; each saved step
              then reaches every replica through `load_adapter`.

One multi-GPU node can instead run one vLLM with `--data-parallel-size N` (vLLM balances its
ranks itself and broadcasts adapter loads, but has no affinity between a rollout's turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_backend._errors import EngineStoppedError, InvalidRequestError
from art_backend.engines._engine import (
    Engine,
    EngineMetrics,
    FinishEvent,
    GenerationRequest,
    TrainableEngine,
)

logger = logging.getLogger("art_backend.replicas")

ROUTINGS = ("sticky", "least", "random")
HEALTH_INTERVAL_S = 1.0
PROBE_FAILURES_TO_TAKE_OUT = 3  # a probe may time out once on a busy machine; a dead one refuses
MAX_SESSIONS = 65536  # sticky sessions remembered (least recently used forgotten first)

Probe = Callable[[], str | None]  # why a replica no longer serves, else None


@dataclass
class _Flight:
    """A request in flight on one replica: its events are forwarded to the caller's queue."""

    request: GenerationRequest
    replica: int
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    open_choices: set[int]
    forwarder: asyncio.Task | None = None


@dataclass
class _Session:
    """Where a session's last turn ran, and a fingerprint of its prompt (for prefix reuse)."""

    replica: int
    prompt_length: int
    prompt_digest: bytes


@dataclass(eq=False)
class Replica:
    """One engine of the set, with what the set counts about it."""

    engine: Engine
    probe: Probe | None = None
    out: str | None = None  # why it was taken out; None while it serves
    returns: bool = False  # taken out by its probe alone: taken back once the probe passes
    taken_back: int = 0
    rows_in_flight: int = 0
    requests_routed: int = 0
    requests_failed_by_takeout: int = 0
    probe_failures: int = 0
    flights: set[int] = field(default_factory=set)  # ids of its `_Flight`s


@dataclass
class RoutingCounters:
    """Follow-up turns of sessions, and the prompt tokens a prefix cache could have reused."""

    follow_up_turns: int = 0
    follow_up_same_replica: int = 0
    follow_up_prompt_tokens: int = 0
    reusable_prefix_tokens: int = 0  # the previous turn's prompt, met again on its replica


class ReplicaSet:
    """Implements `Engine` over N engines of the same model (see the module doc)."""

    def __init__(
        self,
        engines: list[Engine],
        *,
        probes: list[Probe | None] | None = None,
        routing: str = "sticky",
        health_interval: float = HEALTH_INTERVAL_S,
        seed: int | None = None,
    ) -> None:
        if not engines:
            raise InvalidRequestError("A replica set needs at least one engine.")
        if routing not in ROUTINGS:
            raise InvalidRequestError(f"--routing must be one of {', '.join(ROUTINGS)}")
        probes = probes or [None] * len(engines)
        self.replicas = [
            Replica(engine, probe) for engine, probe in zip(engines, probes, strict=True)
        ]
        first = engines[0]
        self.name = first.name
        self.tokenizer = first.tokenizer
        self.context_length = first.context_length
        self.routing = routing
        self.health_interval = health_interval
        self.adapters: dict[str, Path] = {}  # served name -> the folder every replica loaded
        self.counters = RoutingCounters()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._flights: dict[int, _Flight] = {}
        self._flight_ids = itertools.count()
        self._rotation = itertools.count()
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # routing state: the loop routes, the monitor takes out
        self._adapter_lock = threading.Lock()  # one adapter change at a time
        self._stopped = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="art-replicas", daemon=True)

    # ----------------------------------------------------------------------------------- control

    def start(self) -> None:
        """Start every replica (in parallel: a vLLM server takes a while), then the monitor."""
        self._on_every([r.engine for r in self.replicas], lambda engine: engine.start())
        self._monitor.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the monitor and every replica."""
        self._stopped.set()
        self._on_every([r.engine for r in self.replicas], lambda engine: engine.stop(timeout))

    def failure(self) -> str | None:
        """None while one replica serves; once none does, why each was taken out."""
        if any(replica.out is None for replica in self.replicas):
            return None
        reasons = "; ".join(f"replica {i}: {r.out}" for i, r in enumerate(self.replicas))
        return f"every engine replica was taken out ({reasons})"

    @property
    def metrics(self) -> EngineMetrics:
        """The replicas' counters added up (taken-out ones too: counters never go back)."""
        total = EngineMetrics()
        for replica in self.replicas:
            for name, value in vars(replica.engine.metrics).items():
                if name == "max_batch_size_seen":
                    total.max_batch_size_seen = max(total.max_batch_size_seen, value)
                else:
                    setattr(total, name, getattr(total, name) + value)
            total.requests_failed += replica.requests_failed_by_takeout
        return total

    @metrics.setter
    def metrics(self, _: EngineMetrics) -> None:
        raise AttributeError("a replica set's metrics are its replicas' counters, added up")

    @property
    def queue_depth(self) -> int:
        return sum(r.engine.queue_depth for r in self.replicas if r.out is None)

    @property
    def running_rows(self) -> int:
        return sum(r.engine.running_rows for r in self.replicas if r.out is None)

    @property
    def vocab_size(self) -> int:
        return self.replicas[0].engine.vocab_size

    @property
    def threads(self) -> Any:
        """Replica 0's thread governor (the torch engine on a CPU), read by /metrics."""
        return getattr(self.replicas[0].engine, "threads", None)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Every replica's `paused()` at once (vLLM sleeping while the trainer uses its GPU)."""
        async with contextlib.AsyncExitStack() as stack:
            for replica in self.replicas:
                pause = getattr(replica.engine, "paused", None)
                if pause is not None and replica.out is None:
                    await stack.enter_async_context(pause())
            yield

    def replica_states(self) -> list[dict[str, Any]]:
        """Per replica: up or out (and why), rows in flight, requests routed to it."""
        return [
            {
                "replica": index,
                "engine": replica.engine.name,
                "up": replica.out is None,
                "error": replica.out,
                "rows_in_flight": replica.rows_in_flight,
                "requests_routed": replica.requests_routed,
                "requests_failed_by_takeout": replica.requests_failed_by_takeout,
                "taken_back": replica.taken_back,
            }
            for index, replica in enumerate(self.replicas)
        ]

    # ---------------------------------------------------------------------------------- adapters

    def load_adapter(self, served_name: str, path: Path) -> None:
        """Load on every live replica; the name is served only once all of them have it."""
        with self._adapter_lock:
            live = [r for r in self.replicas if r.out is None]
            errors = self._on_every(
                [r.engine for r in live],
                lambda engine: engine.load_adapter(served_name, path),
                raise_first=False,
            )
            failed = [(r, e) for r, e in zip(live, errors, strict=True) if e is not None]
            for replica, _ in failed:
                why = replica.engine.failure()
                if why is not None:  # it died meanwhile: take it out, the others serve the step
                    self._take_out(self.replicas.index(replica), why)
            refused = [error for replica, error in failed if replica.out is None]
            if refused or all(r.out is not None for r in live):
                self.adapters.pop(served_name, None)
                for replica in live:
                    if replica.out is None and served_name in replica.engine.adapters:
                        self._unload_quietly(replica, served_name)
                if refused:
                    raise refused[0]
                raise EngineStoppedError("Every engine replica was taken out; nothing loaded it.")
            self.adapters[served_name] = Path(path)

    def unload_adapter(self, served_name: str) -> None:
        """Withdraw the name (new requests are refused), then unload it on every replica."""
        with self._adapter_lock:
            self.adapters.pop(served_name)
            for replica in self.replicas:
                if replica.out is None and served_name in replica.engine.adapters:
                    self._unload_quietly(replica, served_name)

    def _unload_quietly(self, replica: Replica, served_name: str) -> None:
        try:
            replica.engine.unload_adapter(served_name)
        except Exception as error:  # noqa: BLE001 - the name is withdrawn either way
            logger.warning(
                "replica %d did not unload %s: %s", self.replicas.index(replica), served_name, error
            )

    # ---------------------------------------------------------------------------------- requests

    def submit(self, request: GenerationRequest) -> asyncio.Queue:
        """Route the request to a replica; its events arrive on the returned queue."""
        if request.adapter is not None and request.adapter not in self.adapters:
            raise InvalidRequestError(f"Adapter {request.adapter!r} is not loaded.", param="model")
        loop = asyncio.get_running_loop()
        while True:
            index = self._route(request)
            try:
                inner = self.replicas[index].engine.submit(request)
            except EngineStoppedError as error:  # its process went away since the last check
                self._take_out(index, error.message)
                continue
            break
        flight = _Flight(request, index, asyncio.Queue(), loop, set(range(request.n)))
        with self._lock:
            flight_id = next(self._flight_ids)
            self._flights[flight_id] = flight
            replica = self.replicas[index]
            replica.flights.add(flight_id)
            replica.rows_in_flight += request.n
            replica.requests_routed += 1
        flight.forwarder = loop.create_task(self._forward(flight_id, flight, inner))
        return flight.events

    def _route(self, request: GenerationRequest) -> int:
        """The replica for this request (and the session's memory of it)."""
        session = request.session
        with self._lock:
            live = [i for i, r in enumerate(self.replicas) if r.out is None]
            if not live:
                raise EngineStoppedError(
                    f"The engine cannot serve: {self.failure()}. Restart the server."
                )
            previous = self._sessions.get(session) if session is not None else None
            if self.routing == "random":
                index = self._random.choice(live)
            elif self.routing == "sticky" and previous is not None and previous.replica in live:
                index = previous.replica
            else:
                turn = next(self._rotation)
                index = min(
                    live,
                    key=lambda i: (
                        self.replicas[i].rows_in_flight,
                        (i - turn) % len(self.replicas),
                    ),
                )
            if session is not None:
                self._remember(session, previous, index, request.prompt_ids)
            return index

    def _remember(
        self, session: str, previous: _Session | None, index: int, prompt_ids: list[int]
    ) -> None:
        """Count the follow-up turn's reusable prefix, and note where this turn runs (lock held)."""
        if previous is not None:
            counters = self.counters
            counters.follow_up_turns += 1
            counters.follow_up_prompt_tokens += len(prompt_ids)
            if previous.replica == index:
                counters.follow_up_same_replica += 1
                head = prompt_ids[: previous.prompt_length]
                if len(head) == previous.prompt_length and _digest(head) == previous.prompt_digest:
                    counters.reusable_prefix_tokens += previous.prompt_length
        self._sessions[session] = _Session(index, len(prompt_ids), _digest(prompt_ids))
        self._sessions.move_to_end(session)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    async def _forward(self, flight_id: int, flight: _Flight, inner: asyncio.Queue) -> None:
        """Pass the replica's events on until every choice has finished."""
        try:
            while flight.open_choices:
                event = await inner.get()
                if isinstance(event, FinishEvent):
                    flight.open_choices.discard(event.choice_index)
                flight.events.put_nowait(event)
        finally:
            with self._lock:
                self._flights.pop(flight_id, None)
                replica = self.replicas[flight.replica]
                if flight_id in replica.flights:
                    replica.flights.discard(flight_id)
                    replica.rows_in_flight -= flight.request.n

    # ------------------------------------------------------------------------------------ health

    def _watch(self) -> None:
        while not self._stopped.wait(self.health_interval):
            try:
                self.check_health()
            except Exception:  # the watcher outlives one bad round, loudly
                logger.exception("the replicas' health check failed; it runs again next round")

    def check_health(self) -> None:
        """Take out every replica whose engine failed or whose probe failed too often; take
        back one its probe took out once the probe passes (see the module doc)."""
        for index, replica in enumerate(self.replicas):
            if self._stopped.is_set():
                return
            if replica.out is not None:
                if replica.returns:
                    self._try_take_back(index)
                continue
            why = replica.engine.failure()
            returns = False
            if why is None and replica.probe is not None:
                probed = self._probe(replica)
                replica.probe_failures = replica.probe_failures + 1 if probed else 0
                if replica.probe_failures >= PROBE_FAILURES_TO_TAKE_OUT:
                    why, returns = probed, True
            if why is not None:
                self._take_out(index, why, returns=returns)

    @staticmethod
    def _probe(replica: Replica) -> str | None:
        """Why `replica`'s probe fails, or None. A probe that raises fails with its error (the
        watcher thread would otherwise end with it, and nothing would take a replica out)."""
        assert replica.probe is not None
        try:
            return replica.probe()
        except Exception as error:  # noqa: BLE001 - any error of a probe is a failed probe
            return f"its health probe raised {type(error).__name__}: {error}"

    def _try_take_back(self, index: int) -> None:
        """Serve on the replica again if its probe passes and it takes every adapter served."""
        replica = self.replicas[index]
        if replica.engine.failure() is not None:
            replica.returns = False  # its engine itself failed since: out for good
            return
        if self._probe(replica) is not None:
            return
        with self._adapter_lock:
            if replica.out is None or not replica.returns:
                return  # another health check (the watcher's, a caller's) took it back first
            try:
                for served_name, path in list(self.adapters.items()):
                    replica.engine.load_adapter(served_name, path)
            except Exception as error:  # noqa: BLE001 - stays out; tried again next round
                logger.warning("replica %d answers but did not take the adapters: %s", index, error)
                return
            for served_name in [n for n in replica.engine.adapters if n not in self.adapters]:
                self._unload_quietly(replica, served_name)
            with self._lock:
                why, replica.out = replica.out, None
                replica.returns = False
                replica.probe_failures = 0
                replica.taken_back += 1
        logger.warning("engine replica %d taken back (it was out: %s)", index, why)

    def _take_out(self, index: int, why: str, *, returns: bool = False) -> None:
        """Stop routing to the replica and fail its requests in flight, naming it and why;
        `returns`: it is taken back once its probe passes again."""
        with self._lock:
            replica = self.replicas[index]
            if replica.out is not None:
                return
            replica.out = why
            replica.returns = returns
            flights = [self._flights[f] for f in replica.flights if f in self._flights]
            replica.flights.clear()
            replica.rows_in_flight = 0
            replica.requests_failed_by_takeout += len(flights)
            survivors = sum(r.out is None for r in self.replicas)
        logger.error(
            "engine replica %d taken out (%s); %d request(s) in flight on it fail, "
            "%d replica(s) serve on",
            index,
            why,
            len(flights),
            survivors,
        )
        message = (
            f"engine replica {index} was taken out while this request ran ({why}); "
            "retry it: new requests go to the replicas that still serve"
        )
        for flight in flights:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits on it
                flight.loop.call_soon_threadsafe(_fail_flight, flight, message)

    # --------------------------------------------------------------------------------- helpers

    def _on_every(
        self,
        engines: list[Engine],
        action: Callable[[Engine], object],
        *,
        raise_first: bool = True,
    ) -> list[BaseException | None]:
        """Run `action` on every engine at once; each one's error (or None), or raise the first."""
        if len(engines) == 1:
            pool_results = [_outcome(action, engines[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(engines)) as pool:
                pool_results = list(pool.map(lambda engine: _outcome(action, engine), engines))
        if raise_first:
            for error in pool_results:
                if error is not None:
                    raise error
        return pool_results


class TrainableReplicaSet(ReplicaSet):
    """A replica set whose replica 0 is a `TrainableEngine`: the trainer borrows that one."""

    def __init__(self, engines: list[Engine], **options: Any) -> None:
        super().__init__(engines, **options)
        host = engines[0]
        assert isinstance(host, TrainableEngine)
        self.host = host
        self.device = host.device
        self.adaptable_modules = host.adaptable_modules

    def add_trainable_adapter(self, adapter_name: str, peft_config: Any) -> None:
        """Add the trainer's adapter to replica 0's model (never served under its own name)."""
        self.host.add_trainable_adapter(adapter_name, peft_config)

    def remove_trainable_adapter(self, adapter_name: str) -> None:
        """Remove the trainer's adapter from replica 0's model."""
        self.host.remove_trainable_adapter(adapter_name)

    def exclusive(self) -> contextlib.AbstractContextManager[Any]:
        """Hold replica 0's model between two of its decode steps; the others decode on."""
        return self.host.exclusive()


def replica_set(engines: list[Engine], **options: Any) -> ReplicaSet:
    """The set over `engines`: trainable when replica 0 is (see `TrainableReplicaSet`)."""
    if isinstance(engines[0], TrainableEngine):
        return TrainableReplicaSet(engines, **options)
    return ReplicaSet(engines, **options)


def _fail_flight(flight: _Flight, message: str) -> None:
    """On the flight's loop: stop forwarding, and finish every open choice with the error."""
    if flight.forwarder is not None:
        flight.forwarder.cancel()
    flight.request.cancel()  # should the replica come back to it, it drops the rows
    for choice_index in sorted(flight.open_choices):
        flight.events.put_nowait(
            FinishEvent(
                choice_index=choice_index,
                finish_reason="error",
                text="",
                token_ids=[],
                logprobs=[],
                top_logprobs=[],
                error=message,
                unavailable=True,
            )
        )
    flight.open_choices.clear()


def _outcome(action: Callable[[Engine], object], engine: Engine) -> BaseException | None:
    try:
        action(engine)
    except Exception as error:  # noqa: BLE001 - returned to the caller, who decides
        return error
    return None


def _digest(token_ids: list[int]) -> bytes:
    return hashlib.blake2b(repr(token_ids).encode(), digest_size=16).digest()
