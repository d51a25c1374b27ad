"""Separate hosts on one machine: network namespaces on a private switch (root only).

Each host is a network namespace with its own `lo` and one interface, `eth0`, cabled to a
switch: a bridge that lives in a namespace of its own, so nothing of the test touches the
machine's own network stack and no packet leaves the namespaces made here.

    switch namespace  <prefix>-sw:   br0 --- port-a --- eth0 of <prefix>-a   10.231.N.1/24
                                         \\-- port-b --- eth0 of <prefix>-b   10.231.N.2/24
                                          \\- port-c --- eth0 of <prefix>-c   10.231.N.3/24

`<prefix>` is `artns-<pid>-<random>`: two runs (two xdist workers, two engineers on one
machine) never share a name, and the third octet N is drawn at random from the test range
10.231.0.0/16 (the hosts only ever talk to each other, so two runs with the same N do not meet).

A cable pulled is `link_down(host)` (the switch port goes down, the host keeps its address); a
machine that dies is `kill_host(host)` (every process in its namespace SIGKILLed). Teardown
kills every process inside and deletes the namespaces (the switch's with them, which removes
the bridge and every veth), on success, on failure, and at interpreter exit (`atexit`: after a
KeyboardInterrupt). `sweep_leftovers` removes what an earlier run whose process is gone left.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "artns"
SUBNET_FIRST_OCTETS = "10.231"
_OWNED = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+-\w+$")


def unavailable() -> str | None:
    """Why namespace hosts cannot be built here (one line), or None."""
    if shutil.which("ip") is None:
        return "network namespaces need the `ip` command (iproute2)"
    if not _has_net_admin():
        return "network namespaces need CAP_NET_ADMIN (run the netns tests as root)"
    return None


def _has_net_admin() -> bool:
    cap_net_admin = 1 << 12
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & cap_net_admin)
    return False


@dataclass(frozen=True)
class Host:
    """One namespace host: its namespace, its address on the switch, its switch port."""

    letter: str
    namespace: str
    address: str
    port: str  # the switch side of its cable
    interface: str = "eth0"


@dataclass
class Network:
    """Hosts on one switch; commands run inside them with `ip netns exec`."""

    prefix: str
    switch: str
    hosts: list[Host]
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def host(self, letter: str) -> Host:
        """The host named `letter` (`a`, `b`, ...)."""
        return next(host for host in self.hosts if host.letter == letter)

    def run(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside `host` to its end; its output as text (raises on failure)."""
        result = subprocess.run(
            _in(host.namespace, argv),
            env=_environment(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} on host {host.letter} exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def popen(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` inside `host` (killed at teardown at the latest); output to `log`."""
        output = log.open("ab") if log is not None else subprocess.DEVNULL
        try:
            process = subprocess.Popen(
                _in(host.namespace, argv),
                env=_environment(env),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log is not None:
                output.close()  # type: ignore[union-attr]
        self._processes.append(process)
        return process

    def link_down(self, host: Host) -> None:
        """Pull the host's cable: its switch port goes down, nothing reaches it or leaves it."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def link_up(self, host: Host) -> None:
        """Plug the cable back in."""
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def pids(self, host: Host) -> list[int]:
        """Every process running inside the host's namespace."""
        listed = subprocess.run(
            ["ip", "netns", "pids", host.namespace], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in listed.stdout.split()]

    def kill_host(self, host: Host) -> int:
        """SIGKILL every process in the host, as when the machine dies; how many were killed."""
        return _kill_all(host.namespace)

    def close(self) -> None:
        """Kill every process inside the hosts and delete every namespace made (idempotent)."""
        for process in self._processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for namespace in [*(host.namespace for host in self.hosts), self.switch]:
            _remove_namespace(namespace)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self._processes.clear()


def build(count: int) -> Network:
    """`count` hosts (`a`, `b`, ...) on a fresh switch; removed by `close()` or at exit."""
    if not 1 <= count <= 26:
        raise ValueError(f"between 1 and 26 hosts, got {count}")
    prefix = f"{PREFIX}-{os.getpid()}-{random.getrandbits(24):06x}"
    subnet = f"{SUBNET_FIRST_OCTETS}.{random.randint(1, 254)}"
    switch = f"{prefix}-sw"
    hosts = [
        Host(letter, f"{prefix}-{letter}", f"{subnet}.{index + 1}", f"port-{letter}")
        for index, letter in enumerate("abcdefghijklmnopqrstuvwxyz"[:count])
    ]
    network = Network(prefix, switch, hosts)
    atexit.register(network.close)
    try:
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for host in hosts:
            _ip("netns", "add", host.namespace)
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("link", "add", host.port, "netns", switch, "type", "veth",
                "peer", "name", host.interface, "netns", host.namespace)  # fmt: skip
            _ip("-n", switch, "link", "set", host.port, "master", "br0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
    except BaseException:
        network.close()
        raise
    return network


@contextlib.contextmanager
def network(count: int) -> Iterator[Network]:
    """`build(count)` for the block, closed whatever happens in it."""
    built = build(count)
    try:
        yield built
    finally:
        built.close()


def reaches(net: Network, source: Host, target: Host, seconds: float = 1.0) -> bool:
    """Whether `source` gets an answer from `target` within `seconds`: a TCP connect to a port
    nobody listens on, refused by a host that is there (this machine has no `ping`)."""
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({target.address!r}, 9), {seconds})\n"
        "except ConnectionRefusedError:\n"
        "    sys.exit(0)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    return net.run(source, [sys.executable, "-c", probe], check=False).returncode == 0


def wait_reachable(net: Network, source: Host, target: Host, timeout: float = 20.0) -> None:
    """Until `source` reaches `target` (a fresh switch port learns for a moment)."""
    deadline = time.monotonic() + timeout
    while not reaches(net, source, target):
        if time.monotonic() > deadline:
            raise RuntimeError(f"host {target.letter} never answered host {source.letter}")


def sweep_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; the names deleted."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    removed = []
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = _OWNED.match(name)
        if owner is None or _alive(int(owner.group(1))):
            continue
        _remove_namespace(name)
        removed.append(name)
    return removed


def namespaces_of(prefix: str) -> list[str]:
    """The namespaces whose name starts with `prefix` (what a teardown must leave none of)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.startswith(prefix)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_namespace(namespace: str) -> None:
    if not Path("/run/netns", namespace).exists():
        return
    _kill_all(namespace)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


def _kill_all(namespace: str) -> int:
    """SIGKILL the namespace's processes until none is left (a dying parent may fork)."""
    killed = 0
    for _ in range(20):
        listed = subprocess.run(
            ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
        )
        pids = [int(pid) for pid in listed.stdout.split()]
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.1)
    return killed


def _in(namespace: str, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", namespace, *argv]


def _environment(env: Mapping[str, str] | None) -> dict[str, str] | None:
    """The machine's environment under `env`; Ray's own settings come only from `env`."""
    if env is None:
        return None
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**inherited, **env}


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
