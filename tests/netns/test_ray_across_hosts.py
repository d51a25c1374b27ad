"""Rollouts on a Ray cluster of three namespace hosts, deployed as docs/cluster.md tells a user:
host a runs the Ray head, art-server (bound to its own address) and the user's loop; hosts b and
c are rollout nodes. Token authentication is on (Ray's recommended mode) throughout.

Faults: a cable pulled for a moment loses nothing; a cable pulled until Ray gives the host up,
and a host killed whole, send its rollouts to the other host (counted `retried`), every answer
kept. A driver whose token the cluster refuses, and a stale token against a cluster without
tokens, fail with `RayAuthenticationError` saying so.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.netns._deployment import API_KEY, BIN, Deployment
from tests.support import netns

pytestmark = [pytest.mark.netns, pytest.mark.timeout(600)]

RUNS = 8
SECONDS = 4.0


@pytest.fixture(scope="module")
def cluster(hosts: netns.Network, tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    """Ray head and art-server on a, rollout nodes b and c; token mode."""
    with tempfile.TemporaryDirectory(prefix="ns-", dir="/tmp") as root:
        deployment = Deployment(hosts, Path(root), token="t" * 32, logs=Path(root))
        try:
            a, b, c = hosts.hosts
            head = deployment.start_head(a)
            deployment.start_worker(b, head)
            deployment.start_worker(c, head)
            server = deployment.start_server(a, tiny_model_dir)
            yield {"deployment": deployment, "head": head, "server": server}
        finally:
            deployment.close()


def test_rollouts_run_on_both_rollout_hosts_against_the_head_hosts_server_and_train(
    cluster: dict[str, Any], hosts: netns.Network, tiny_model_dir: Path
) -> None:
    a, b, c = hosts.hosts
    answer = cluster["deployment"].drive(
        a, "rollouts", env={"RAY_ADDRESS": cluster["head"]}, server=cluster["server"], key=API_KEY,
        model=str(tiny_model_dir), train=True,
    )  # fmt: skip
    assert "crashed" not in answer, answer
    # Every node advertises its own address, never 127.0.0.1, and both rollout hosts ran.
    assert answer["worker_hosts"] == answer["rollout_hosts"] == [b.address, c.address]
    assert answer["trajectories"] == 16 and answer["exceptions"] == 0
    assert answer["step"] == 1 and abs(answer["ratio_mean"] - 1.0) < 1e-3


def slow_rollouts_with(
    cluster: dict[str, Any], hosts: netns.Network, fault: Any, **spec: Any
) -> dict[str, Any]:
    """Run RUNS slow rollouts from host a; once all have started, `fault(host b)`."""
    a, b, _ = hosts.hosts
    deployment: Deployment = cluster["deployment"]
    marks = deployment.root / f"marks-{time.monotonic_ns()}"
    marks.mkdir()
    driver = hosts.popen(
        a,
        [str(BIN / "python"), "-m", "tests.netns._driver", "slow",
         f'{{"marks": "{marks}", "runs": {RUNS}, "seconds": {SECONDS}, '
         f'"infra_retries": {spec.get("infra_retries", 1)}}}'],
        env=deployment.env(a, RAY_ADDRESS=cluster["head"]),
        log=marks.with_suffix(".log"),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < RUNS:
        assert time.monotonic() < deadline and driver.poll() is None, marks.with_suffix(".log")
        time.sleep(0.2)
    fault(b)
    driver.wait(180)
    from tests.netns._deployment import answer_of

    return answer_of(marks.with_suffix(".log").read_text(), "")


def test_a_cable_pulled_for_a_moment_loses_nothing(
    cluster: dict[str, Any], hosts: netns.Network
) -> None:
    def blink(host: netns.Host) -> None:
        hosts.link_down(host)
        time.sleep(2.0)  # under Ray's 4 health checks of 1 s: the node stays alive
        hosts.link_up(host)

    answer = slow_rollouts_with(cluster, hosts, blink)
    assert answer["rewards"] == [float(i) for i in range(RUNS)], answer
    assert answer["stats"]["retried"] == 0 and answer["stats"]["lost"] == 0


def restart_rollout_host(cluster: dict[str, Any], host: netns.Host) -> None:
    """What an operator does after the machine comes back: its Ray node started again."""
    deployment: Deployment = cluster["deployment"]
    deployment.stop_ray(host)
    deployment.start_worker(host, cluster["head"])


def test_a_cable_pulled_until_ray_gives_the_host_up_sends_its_rollouts_to_the_other(
    cluster: dict[str, Any], hosts: netns.Network
) -> None:
    _, b, c = hosts.hosts

    def cut_until_dead(host: netns.Host) -> None:
        hosts.link_down(host)
        time.sleep(12.0)  # past Ray's health checks: the head marks the node dead
        hosts.link_up(host)

    try:
        answer = slow_rollouts_with(cluster, hosts, cut_until_dead)
    finally:
        restart_rollout_host(cluster, b)
    assert answer["rewards"] == [float(i) for i in range(RUNS)], answer
    assert answer["rollout_hosts"] == [c.address] * RUNS
    assert answer["stats"]["retried"] == RUNS // 2 and answer["stats"]["lost"] == 0


def test_a_host_killed_whole_with_retries_off_counts_its_rollouts_lost(
    cluster: dict[str, Any], hosts: netns.Network
) -> None:
    _, b, c = hosts.hosts
    try:
        answer = slow_rollouts_with(cluster, hosts, hosts.kill_host, infra_retries=0)
    finally:
        restart_rollout_host(cluster, b)
    assert answer["rewards"] and len(answer["rewards"]) == RUNS // 2, answer
    assert answer["rollout_hosts"] == [c.address] * (RUNS // 2)
    assert len(answer["exceptions"]) == RUNS // 2
    assert answer["stats"]["lost"] == RUNS // 2 and answer["stats"]["retried"] == 0


def test_a_driver_whose_token_the_cluster_refuses_fails_by_name(
    cluster: dict[str, Any], hosts: netns.Network
) -> None:
    a = hosts.hosts[0]
    deployment: Deployment = cluster["deployment"]
    stranger = Deployment(hosts, deployment.root / "stranger", token="x" * 32, logs=deployment.root)
    answer = stranger.drive(a, "connect", env={"RAY_ADDRESS": cluster["head"]}, start_timeout=300.0)
    assert answer.get("error") == "RayAuthenticationError", answer
    assert "refused this driver's authentication token" in str(answer["message"])
    assert "~/.ray/auth_token" in str(answer["message"])
    print(f"refused after {answer['seconds']:.1f} s")  # ray.init alone gave up after 20 s


def test_a_stale_token_against_a_cluster_without_tokens_fails_by_name() -> None:
    """The case of issue 54: Ray turns token mode on in the driver by itself when it finds a
    token file; the cluster runs without, and every worker dies."""
    with netns.network(1) as alone, tempfile.TemporaryDirectory(prefix="ns-", dir="/tmp") as root:
        [host] = alone.hosts
        deployment = Deployment(alone, Path(root), token="s" * 32, logs=Path(root))
        try:
            no_tokens = {**deployment.env(host), "RAY_AUTH_MODE": "disabled"}
            alone.run(
                host,
                [str(BIN / "ray"), "start", "--head", f"--node-ip-address={host.address}",
                 "--num-cpus=1", '--resources={"art_rollout": 8}', "--include-dashboard=false",
                 f"--temp-dir={deployment.temp_dir(host)}", "--object-store-memory=100000000"],
                env=no_tokens,
            )  # fmt: skip
            # The user's shell: no RAY_AUTH_MODE, the stale token in ~/.ray/auth_token.
            answer = deployment.drive(
                host, "connect", env={"RAY_AUTH_MODE": None}, start_timeout=300.0
            )
        finally:
            deployment.close()
    assert answer.get("error") == "RayAuthenticationError", answer
    assert "RAY_AUTH_MODE is unset" in str(answer["message"])
    assert "RAY_AUTH_MODE=disabled" in str(answer["message"])
