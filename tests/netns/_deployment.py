"""What a user runs on three machines, run on three namespace hosts (tests/support/netns.py).

Ray is started with its CLI, as docs/cluster.md tells a user: `ray start --head` on host a (the
head: no CPUs for Ray, `art_head`), `ray start --address=<a>:6379` on b and c (the rollout nodes:
`art_rollout`), each with `--node-ip-address` its own address. The loopback tests use
`ray.cluster_utils.Cluster` instead; here the hosts are separate machines, so the CLI inside each
namespace is the deployment under test.

Every host gets its own HOME and Ray temp folder under one short folder of the run, and the
cluster runs with token authentication (`RAY_AUTH_MODE=token`, the token in each host's
`~/.ray/auth_token`): nothing reads or writes the real home's Ray state. Stopping is killing every
process in the host's namespace: `ray stop` matches processes by name machine-wide and would stop
other Ray clusters on this machine (another test run's).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.netns import Host, Network

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RAY_PORT = 6379
SERVER_PORT = 8000
API_KEY = "netns-test-key"
# Ray's default: a node unheard of for 5 periods of 3 s is dead. A second each keeps a cut
# cable's test short; the head reads them at its start.
HEALTH_CHECK = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "4",
}


@dataclass
class Deployment:
    """A Ray cluster and servers on namespace hosts; `close()` stops all of it."""

    network: Network
    root: Path  # short: Ray's socket paths must stay under 107 bytes
    token: str
    logs: Path
    ray_hosts: list[Host] = field(default_factory=list)

    def env(self, host: Host, **extra: str | None) -> dict[str, str]:
        """The environment of anything run on `host`: its own HOME and Ray folders, the
        cluster's token mode, the checkout's packages on the path."""
        home = self.root / f"home-{host.letter}"
        (home / ".ray").mkdir(parents=True, exist_ok=True)
        token_file = home / ".ray" / "auth_token"
        if not token_file.exists():
            token_file.write_text(self.token)
        paths = [str(REPO), *(os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        settings = {
            "HOME": str(home),
            "RAY_TMPDIR": str(self.root / f"ray-{host.letter}"),
            "RAY_AUTH_MODE": "token",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join(filter(None, paths)),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            **HEALTH_CHECK,
            **extra,
        }
        return {name: value for name, value in settings.items() if value is not None}

    def temp_dir(self, host: Host) -> Path:
        """The host's Ray temp folder: `$RAY_TMPDIR/ray`, where a driver's `address="auto"`
        looks for the cluster `ray start` recorded (`ray_current_cluster`)."""
        return self.root / f"ray-{host.letter}" / "ray"

    def start_head(self, host: Host) -> str:
        """`ray start --head` on `host`; the address the others join."""
        self._ray_start(
            host, "--head", f"--port={RAY_PORT}", "--num-cpus=0", "--num-gpus=0",
            '--resources={"art_head": 1}', "--include-dashboard=false",
        )  # fmt: skip
        return f"{host.address}:{RAY_PORT}"

    def start_worker(self, host: Host, head: str, rollout_slots: int = 8) -> None:
        """`ray start --address=<head>` on `host`, a rollout node."""
        self._ray_start(
            host, f"--address={head}", "--num-cpus=1",
            f'--resources={{"art_rollout": {rollout_slots}}}',
        )  # fmt: skip

    def _ray_start(self, host: Host, *args: str) -> None:
        self.network.run(
            host,
            [
                str(BIN / "ray"), "start", *args, f"--node-ip-address={host.address}",
                f"--temp-dir={self.temp_dir(host)}",
                "--object-store-memory=100000000", "--disable-usage-stats",
            ],
            env=self.env(host),
            timeout=120,
        )  # fmt: skip
        if host not in self.ray_hosts:
            self.ray_hosts.append(host)

    def stop_ray(self, host: Host) -> None:
        """Every process on the host gone (its Ray node with them)."""
        self.network.kill_host(host)

    def start_server(self, host: Host, model: Path, *extra: str, wait: bool = True) -> str:
        """`art-server` on `host`, bound to its address, behind the key; its URL once up
        (`wait=False`: at once; `wait_healthy` waits)."""
        url = f"http://{host.address}:{SERVER_PORT}"
        self.network.popen(
            host,
            [
                str(BIN / "art-server"), "--model", str(model), "--host", host.address,
                "--port", str(SERVER_PORT), "--path", str(self.root / f"art-{host.letter}"),
                *extra,
            ],
            env=self.env(host, ART_API_KEY=API_KEY),
            log=self.logs / f"art-server-{host.letter}.log",
        )  # fmt: skip
        if wait:
            self.wait_healthy(host, url)
        return url

    def wait_healthy(self, host: Host, url: str, timeout: float = 180.0) -> None:
        """Until `url`/health answers 200 from `host` itself (raises with the log past it)."""
        probe = f"import httpx, sys; sys.exit(httpx.get({url + '/health'!r}).status_code != 200)"
        deadline = time.monotonic() + timeout
        while self.network.run(host, [sys.executable, "-c", probe], check=False).returncode:
            if time.monotonic() > deadline:
                log = self.logs / f"art-server-{host.letter}.log"
                tail = log.read_text()[-3000:] if log.exists() else ""
                raise RuntimeError(f"art-server on host {host.letter} never answered:\n{tail}")
            time.sleep(0.5)

    def drive(
        self,
        host: Host,
        scenario: str,
        *,
        env: dict[str, str | None] | None = None,
        timeout: float = 240.0,
        **spec: object,
    ) -> dict[str, object]:
        """Run `tests.netns._driver <scenario>` on `host` (the user's loop), with `env` over the
        host's environment (None: unset); its JSON answer."""
        result = self.network.run(
            host,
            [sys.executable, "-m", "tests.netns._driver", scenario, json.dumps(spec)],
            env=self.env(host, **(env or {})),
            timeout=timeout,
            check=False,
        )
        return answer_of(result.stdout, result.stderr)

    def close(self) -> None:
        """Stop every host's processes; the run's folder goes."""
        for host in self.network.hosts:
            self.network.kill_host(host)
        shutil.rmtree(self.root, ignore_errors=True)


def answer_of(stdout: str, stderr: str) -> dict[str, object]:
    """The driver's answer: the last line of its output that reads as JSON."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"the driver gave no answer:\n{stdout[-3000:]}\n{stderr[-5000:]}")


def server_health(network: Network, host: Host, url: str) -> dict[str, object]:
    """GET /health of `url` as `host` sees it."""
    probe = f"import httpx; print(httpx.get({url + '/health'!r}, timeout=5).text)"
    return json.loads(network.run(host, [sys.executable, "-c", probe]).stdout)
