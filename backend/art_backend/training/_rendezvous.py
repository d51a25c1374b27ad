"""Where the training ranks meet, through which interface, and how they meet again.

The names are torchrun's: MASTER_ADDR and MASTER_PORT (rank 0's host, as the other hosts reach
it, and a free port there), RANK and WORLD_SIZE. On several machines, start `art-server` on each
with them set (rank 0 serves HTTP, the others only train), or start it under torchrun; on one
machine `art-server --train-processes N` picks 127.0.0.1 and a free port itself.

The interface gloo binds: unless GLOO_SOCKET_IFNAME names one, gloo binds the address the
machine's host name resolves to, which on many machines is 127.0.0.1: every rank then
advertises loopback and the others connect to themselves. So a rank binds the interface its
kernel routes MASTER_ADDR through (the source address of a UDP socket connected to it, which
sends nothing), or the one GLOO_SOCKET_IFNAME names (checked to exist on this host).

Meeting again: rank 0 holds a key-value store (torch's TCPStore) on MASTER_PORT for the whole
run and counts the group's generations in it. A cut link fails a step's collective after
`collective_timeout`; every rank then leaves the group. Rank 0 re-forms it when the next step
comes (`open_generation`), and the other ranks wait for the count to pass the generation they
left (`next_generation`) and join that one: each generation's keys live under their own prefix,
so no rank reads an address its peer advertised before the cut.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import psutil
import torch.distributed as dist

from art_backend._errors import InvalidRequestError

# How long a rank waits inside one collective of a step for the others. Shards are balanced by
# tokens, so the wait is the difference between the ranks' compute of one step (seconds on equal
# hardware), plus what serving takes from rank 0. Five minutes leaves room for that, and is what
# a cut link costs a step instead of torch's default of 30 minutes.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# The others notice a lost group within one collective timeout, then rejoin: rank 0 waits
# this many of them for them at a re-forming.
REFORM_PATIENCE = 3
GENERATION_KEY = "art/generation"
VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class Rendezvous:
    """One rank's settings for meeting the others (torchrun's names; checked when built)."""

    master_addr: str
    master_port: int
    rank: int
    world_size: int
    interface: str | None = None  # None: the interface that routes to master_addr
    collective_timeout: timedelta = COLLECTIVE_TIMEOUT
    agent_store: bool = False  # torchrun's agent holds the store; rank 0 is one of its clients

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise InvalidRequestError(f"WORLD_SIZE={self.world_size}: at least 1 training rank.")
        if not 0 <= self.rank < self.world_size:
            raise InvalidRequestError(
                f"RANK={self.rank} with WORLD_SIZE={self.world_size}: ranks are 0 to "
                f"{self.world_size - 1}, one per process; rank 0 serves HTTP."
            )
        if not 1 <= self.master_port <= 65535:
            raise InvalidRequestError(
                f"MASTER_PORT={self.master_port}: a TCP port (1-65535) free on rank 0's host."
            )
        if self.collective_timeout <= timedelta(0):
            raise InvalidRequestError("ART_TRAIN_COLLECTIVE_TIMEOUT: a positive number of seconds.")
        _resolved(self.master_addr)

    @classmethod
    def local(cls, world_size: int) -> Rendezvous:
        """All ranks on this machine: 127.0.0.1 and a free port (`--train-processes N`)."""
        return cls("127.0.0.1", _free_port(), 0, world_size)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Rendezvous:
        """torchrun's variables (set by torchrun, or by hand on each machine), the explicit
        GLOO_SOCKET_IFNAME, and ART_TRAIN_COLLECTIVE_TIMEOUT in seconds."""
        environ = os.environ if environ is None else environ
        missing = [name for name in VARIABLES if not environ.get(name)]
        if missing:
            raise InvalidRequestError(
                f"{', '.join(missing)} not set. Training ranks on several processes need "
                "MASTER_ADDR (rank 0's address, as the other hosts reach it), MASTER_PORT (a "
                "free port there), RANK and WORLD_SIZE on every rank, as torchrun sets them."
            )
        timeout = environ.get("ART_TRAIN_COLLECTIVE_TIMEOUT")
        return cls(
            master_addr=environ["MASTER_ADDR"],
            master_port=_integer(environ, "MASTER_PORT"),
            rank=_integer(environ, "RANK"),
            world_size=_integer(environ, "WORLD_SIZE"),
            interface=environ.get("GLOO_SOCKET_IFNAME") or None,
            collective_timeout=(
                COLLECTIVE_TIMEOUT if timeout is None else timedelta(seconds=_number(timeout))
            ),
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )

    def for_rank(self, rank: int) -> Rendezvous:
        """The same meeting, as rank `rank` joins it."""
        return replace(self, rank=rank)

    def gloo_interface(self) -> str:
        """The interface gloo binds here: the one named, else the one routing to rank 0."""
        interfaces = psutil.net_if_addrs()
        if self.interface is not None:
            if self.interface not in interfaces:
                raise InvalidRequestError(
                    f"GLOO_SOCKET_IFNAME={self.interface} names no interface of this host "
                    f"({', '.join(sorted(interfaces))}); name one, or unset it to use the one "
                    f"that routes to MASTER_ADDR {self.master_addr}."
                )
            return self.interface
        return route_interface(self.master_addr, interfaces)

    def connect_store(self, timeout: timedelta) -> Any:
        """The ranks' store on rank 0's host (rank 0 opens it, the others connect to it)."""
        return dist.TCPStore(
            self.master_addr,
            self.master_port,
            is_master=self.rank == 0 and not self.agent_store,
            timeout=timeout,
            wait_for_workers=False,
        )


def route_interface(address: str, interfaces: Mapping[str, list[Any]] | None = None) -> str:
    """The name of the interface this host's kernel sends packets for `address` through."""
    family, _, _, _, target = _resolved(address)
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(target)  # a UDP connect sends nothing: the kernel only picks a route
        except OSError as error:
            raise InvalidRequestError(
                f"No interface of this host routes to MASTER_ADDR {address} ({error.strerror}). "
                "Check the address, or name the interface in GLOO_SOCKET_IFNAME."
            ) from error
        source = probe.getsockname()[0]
    for name, addresses in (interfaces or psutil.net_if_addrs()).items():
        if any(entry.address.split("%")[0] == source for entry in addresses):
            return name
    raise InvalidRequestError(
        f"The route to MASTER_ADDR {address} leaves from {source}, which no interface of this "
        "host holds; name the interface in GLOO_SOCKET_IFNAME."
    )


def open_generation(store: Any) -> int:
    """Rank 0: the next generation of the group (1 at the first meeting)."""
    return int(store.add(GENERATION_KEY, 1))


def next_generation(rendezvous: Rendezvous, after: int, patience: float) -> tuple[Any, int]:
    """A rank other than 0: a store connection and the first generation past `after` that rank
    0 opened. Waits as long as rank 0's store answers (rank 0 forms the group again when the
    next step comes); TimeoutError once it has not answered for `patience` seconds (rank 0 is
    gone, or its host cut off)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            store = rendezvous.connect_store(rendezvous.collective_timeout)
            while True:
                generation = int(store.add(GENERATION_KEY, 0))
                if generation > after:
                    return store, generation
                deadline = time.monotonic() + patience
                time.sleep(0.2)
        except (RuntimeError, OSError) as error:  # out of reach: try again until the deadline
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"rank {rendezvous.rank}: rank 0's store at {rendezvous.master_addr}:"
                    f"{rendezvous.master_port} has not answered for {patience:.0f} s ({error})"
                ) from error
            time.sleep(0.5)


def form_group(
    rendezvous: Rendezvous, store: Any, generation: int, backend: str, timeout: timedelta
) -> Any:
    """Join generation `generation` of the default group (its commands wait `timeout`); the
    group of a step's collectives, which wait `collective_timeout`."""
    if backend == "gloo":
        os.environ["GLOO_SOCKET_IFNAME"] = rendezvous.gloo_interface()
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"art/{generation}", store),
        rank=rendezvous.rank,
        world_size=rendezvous.world_size,
        timeout=timeout,
    )
    return dist.new_group(timeout=rendezvous.collective_timeout)


def _resolved(address: str) -> tuple[Any, ...]:
    try:
        return socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)[0]
    except (socket.gaierror, UnicodeError) as error:
        raise InvalidRequestError(
            f"MASTER_ADDR {address!r} does not resolve on this host; give rank 0's address as "
            "this host reaches it (an IP address avoids name lookups)."
        ) from error


def _integer(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise InvalidRequestError(f"{name}={environ[name]!r}: a whole number.") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidRequestError(
            f"ART_TRAIN_COLLECTIVE_TIMEOUT={text!r}: a number of seconds."
        ) from None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
