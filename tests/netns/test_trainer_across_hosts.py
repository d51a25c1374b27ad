"""The trainer's two processes on two namespace hosts, started as docs/cluster.md tells a user:
torchrun's variables on each host, rank 0 on host a (here the driver, `_trainer_driver`, in
place of the server that would hold it), rank 1 as `art-server` on host b. Gloo runs over the
switch: each rank binds the interface that routes to rank 0, never loopback.

One step trains the adapter one process trains. A cable pulled mid-step fails the step with
`TrainingRanksLostError` after the collective timeout set here (never the 30 minutes a step may
otherwise wait), nothing is trained, and the step sent again once the cable is back trains on a
group formed again. Rank 0's host cut off while rank 1 waits for its next command: rank 1 exits
naming the lost rank 0 after REFORM_PATIENCE collective timeouts, whether it waited in gloo
(`RankZeroWatch`) or to meet rank 0 again, instead of a year or half an hour.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from art_backend.training._other_ranks import EXIT_RANK_ZERO_LOST
from tests.netns._deployment import BIN, REPO, answer_of
from tests.support import netns

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]

MASTER_PORT = 29500
COLLECTIVE_SECONDS = 5  # the rendezvous's collective_timeout: how long a cut link costs a step
CLOSE = 1e-5


def wait_for(mark: Path, rank_0: subprocess.Popen[bytes], log: Path) -> None:
    """Until the driver writes `mark` (fails with its log if it exits first)."""
    deadline = time.monotonic() + 180
    while not mark.exists():
        if rank_0.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {mark.name} from rank 0:\n{log.read_text()[-5000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two_hosts_training(
    hosts: netns.Network, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Rank 1 on host b, rank 0 on host a; the cable of b pulled mid-step and plugged back."""
    a, b, _ = hosts.hosts
    root = tmp_path_factory.mktemp("trainer")  # the hosts share the file system
    marks = root / "marks"
    marks.mkdir()
    environment = {
        "MASTER_ADDR": a.address,
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": "2",
        "ART_TRAIN_COLLECTIVE_TIMEOUT": str(COLLECTIVE_SECONDS),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    rank_1 = hosts.popen(
        b,
        [str(BIN / "art-server"), "--model", str(tiny_model_dir), "--dtype", "float32"],
        env={**environment, "RANK": "1"},
        log=root / "rank1.log",
    )
    spec = {"model": str(tiny_model_dir), "marks": str(marks)}
    log = root / "rank0.log"
    rank_0 = hosts.popen(
        a,
        [sys.executable, "-m", "tests.netns._trainer_driver", json.dumps(spec)],
        env={**environment, "RANK": "0"},
        log=log,
    )
    wait_for(marks / "in-step", rank_0, log)
    hosts.link_down(b)
    (marks / "cut").touch()
    wait_for(marks / "failed", rank_0, log)
    hosts.link_up(b)
    (marks / "up").touch()
    wait_for(marks / "idle", rank_0, log)
    hosts.link_down(a)  # rank 0's host cut off while rank 1 waits for its next command
    cut = time.monotonic()
    try:
        exit_code = rank_1.wait(timeout=120)
        gone_after = time.monotonic() - cut
    finally:
        hosts.link_up(a)
        (marks / "released").touch()
    rank_0.wait(timeout=180)
    rank_1_log = (root / "rank1.log").read_text()
    answer = answer_of(log.read_text(), rank_1_log)
    assert "crashed" not in answer, f"{answer}\nrank 1:\n{rank_1_log[-5000:]}"
    return {**answer, "rank_1_exit": exit_code, "rank_1_gone_after": gone_after,
            "rank_1_log": rank_1_log[-3000:]}  # fmt: skip


def test_one_step_on_two_hosts_trains_what_one_process_trains(two_hosts_training: dict) -> None:
    answer = two_hosts_training
    assert answer["moved"] > 1e-3  # the step did train
    assert answer["first_step_difference"] < CLOSE


def test_a_cable_pulled_mid_step_fails_the_step_by_name_and_trains_nothing(
    two_hosts_training: dict,
) -> None:
    answer = two_hosts_training
    assert answer["error"] == "TrainingRanksLostError"
    assert "the gradients' all-reduce failed" in answer["message"]
    assert "send the step again" in answer["message"]
    assert answer["unchanged"]


def test_the_step_sent_again_after_the_cable_is_back_trains_on_a_group_formed_again(
    two_hosts_training: dict,
) -> None:
    answer = two_hosts_training
    assert answer["generation"] == 2
    assert answer["rerun_difference"] < CLOSE


def test_an_idle_rank_whose_rank_0_host_is_cut_off_exits_by_name_instead_of_waiting(
    two_hosts_training: dict,
) -> None:
    answer = two_hosts_training
    assert answer["rank_1_exit"] == EXIT_RANK_ZERO_LOST, answer["rank_1_log"]
    assert "rank 0's store at" in answer["rank_1_log"]
    assert "rank 0 or its host is lost" in answer["rank_1_log"]
    assert "start this rank again once rank 0 is back" in answer["rank_1_log"]
    # REFORM_PATIENCE collective timeouts, plus at most one store timeout and a poll.
    assert answer["rank_1_gone_after"] < 4 * COLLECTIVE_SECONDS + 10


def test_a_host_binds_its_cable_to_rank_0_and_an_address_it_cannot_route_to_is_refused(
    hosts: netns.Network,
) -> None:
    a, b, _ = hosts.hosts
    probe = (
        "from art_backend._errors import InvalidRequestError\n"
        "from art_backend.training._rendezvous import route_interface\n"
        f"print(route_interface({a.address!r}))\n"
        "try:\n"
        "    route_interface('192.0.2.1')\n"  # TEST-NET-1: no route from a namespace host
        "except InvalidRequestError as error:\n"
        "    print(error.message)\n"
    )
    interface, refusal = hosts.run(b, [sys.executable, "-c", probe]).stdout.splitlines()
    assert interface == b.interface
    assert refusal.startswith("No interface of this host routes to MASTER_ADDR 192.0.2.1")
    assert "GLOO_SOCKET_IFNAME" in refusal
