"""The namespace hosts themselves: own addresses on a private switch, a cable that can be pulled,
and a teardown that leaves nothing behind (namespaces, switch, processes inside)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import netns

pytestmark = pytest.mark.netns


def test_hosts_reach_each_other_by_address_and_the_machine_does_not_reach_them(
    hosts: netns.Network,
) -> None:
    a, b, c = hosts.hosts
    for source, target in [(a, b), (b, c), (c, a)]:
        netns.wait_reachable(hosts, source, target)
    answer = hosts.run(b, ["ip", "-o", "-4", "addr", "show", "eth0"]).stdout
    assert f"{b.address}/24" in answer
    # Neither the machine nor the switch has an address in the hosts' subnet: what the hosts
    # send stays on the switch.
    subnet = a.address.rsplit(".", 1)[0] + "."
    machine = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    switch = subprocess.run(["ip", "-n", hosts.switch, "-o", "-4", "addr"], capture_output=True)
    assert subnet not in machine and subnet not in switch.stdout.decode()


def test_a_pulled_cable_cuts_the_host_off_until_plugged_back(hosts: netns.Network) -> None:
    a, b, _ = hosts.hosts
    netns.wait_reachable(hosts, a, b)
    hosts.link_down(b)
    try:
        assert not netns.reaches(hosts, a, b)
    finally:
        hosts.link_up(b)
    netns.wait_reachable(hosts, a, b)


def test_closing_removes_the_namespaces_and_kills_what_runs_inside() -> None:
    built = netns.build(2)
    sleeper = built.popen(built.hosts[1], [sys.executable, "-c", "import time; time.sleep(600)"])
    assert netns.namespaces_of(built.prefix)
    built.close()
    assert netns.namespaces_of(built.prefix) == []
    assert sleeper.wait(10) is not None


def test_a_run_that_died_leaves_namespaces_the_next_sweep_removes() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = f"{netns.PREFIX}-{gone.pid}-abc123-a"
    subprocess.run(["ip", "netns", "add", orphan], check=True)
    assert orphan in netns.sweep_leftovers()
    assert netns.namespaces_of(orphan) == []
