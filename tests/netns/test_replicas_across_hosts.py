"""Engine replicas on other hosts, deployed as docs/cluster.md tells a user: `art-server
--replica-api` on hosts b and c, each bound to its own address, and on host a the server the
agents call, `art-server --replica-url http://<b>:8000 --replica-url http://<c>:8000`, which
keeps the records and the trainer and routes each rollout to one of the three engines.

Chats from host a spread over the three hosts, every answer recorded on a; an adapter a loads
reaches b and c as files (the hosts' servers share nothing but the network here); b's cable
pulled takes b out (its requests in flight fail with a 503 the client retries elsewhere: nothing
answered is lost), and once the cable is back b is taken back with the adapters served
meanwhile; a host killed whole is taken out and the chats go on.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.netns._deployment import API_KEY, BIN, SERVER_PORT, Deployment, answer_of, server_health
from tests.support import netns
from tests.support.adapters import make_random_adapter

pytestmark = [pytest.mark.netns, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def replicated(hosts: netns.Network, tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    """Replicas on b and c, the front on a."""
    with tempfile.TemporaryDirectory(prefix="ns-", dir="/tmp") as root:
        deployment = Deployment(hosts, Path(root), token="t" * 32, logs=Path(root))
        try:
            a, b, c = hosts.hosts
            urls = [
                deployment.start_server(host, tiny_model_dir, "--replica-api", wait=False)
                for host in (b, c)
            ]
            remotes = [argument for url in urls for argument in ("--replica-url", url)]
            front = deployment.start_server(a, tiny_model_dir, *remotes)
            yield {"deployment": deployment, "front": front, "replicas": urls}
        finally:
            deployment.close()


def chats(replicated: dict[str, Any], hosts: netns.Network, **spec: Any) -> dict[str, Any]:
    """Run the chat driver on host a to its end; its answer."""
    deployment: Deployment = replicated["deployment"]
    body = {"server": replicated["front"], "key": API_KEY, **spec}
    result = hosts.run(
        hosts.hosts[0],
        [str(BIN / "python"), "-m", "tests.netns._chat_driver", json.dumps(body)],
        env=deployment.env(hosts.hosts[0]),
        timeout=240,
        check=False,
    )
    return answer_of(result.stdout, result.stderr)


def front_replicas(replicated: dict[str, Any], hosts: netns.Network) -> list[dict[str, Any]]:
    return server_health(hosts, hosts.hosts[0], replicated["front"])["replicas"]  # type: ignore[return-value]


def wait_until(check: Callable[[], bool], what: str, timeout: float = 90.0) -> float:
    """Seconds until `check()` holds (fails naming `what` after `timeout`)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"never: {what}"
        time.sleep(0.5)
    return time.monotonic() - started


def test_chats_spread_over_the_three_hosts_and_a_records_them(
    replicated: dict[str, Any], hosts: netns.Network
) -> None:
    _, b, c = hosts.hosts
    assert replicated["replicas"] == [f"http://{h.address}:{SERVER_PORT}" for h in (b, c)]
    answer = chats(replicated, hosts, count=12, concurrency=3)
    assert answer.get("failed") == [] and answer["answered"] == answer["recorded"] == 12, answer
    routed = [replica["requests_routed"] for replica in answer["replicas"]]
    assert all(count > 0 for count in routed), routed
    assert [replica["engine"] for replica in answer["replicas"]] == ["torch", "remote", "remote"]


def test_an_adapter_loaded_on_a_is_sent_to_b_and_c(
    replicated: dict[str, Any], hosts: netns.Network, tiny_model_dir: Path
) -> None:
    a, b, c = hosts.hosts
    deployment: Deployment = replicated["deployment"]
    folder = make_random_adapter(tiny_model_dir, deployment.root / "art-a" / "sent", seed=3)
    load = (
        "import httpx, sys; r = httpx.post(sys.argv[1] + '/v1/adapters', json={'name': 'sent@1', "
        f"'path': sys.argv[2]}}, headers={{'Authorization': 'Bearer {API_KEY}'}}, timeout=60); "
        "print(r.status_code, r.text)"
    )
    loaded = hosts.run(a, [str(BIN / "python"), "-c", load, replicated["front"], str(folder)])
    assert loaded.stdout.startswith("200"), loaded.stdout
    for host, url in zip((b, c), replicated["replicas"], strict=True):
        listing = (
            "import httpx, sys; print(httpx.get(sys.argv[1] + '/v1/models', headers="
            f"{{'Authorization': 'Bearer {API_KEY}'}}).text)"
        )
        served = json.loads(hosts.run(host, [str(BIN / "python"), "-c", listing, url]).stdout)
        assert "sent@1" in [model["id"] for model in served["data"]], (host.letter, served)
        assert list((deployment.root / f"art-{host.letter}" / "replica-adapters").iterdir())


def test_a_cut_host_is_taken_out_and_back_and_a_killed_one_out_nothing_answered_lost(
    replicated: dict[str, Any], hosts: netns.Network
) -> None:
    a, b, c = hosts.hosts
    deployment: Deployment = replicated["deployment"]
    progress, stop = deployment.root / "progress", deployment.root / "stop"
    driver = hosts.popen(
        a,
        [str(BIN / "python"), "-m", "tests.netns._chat_driver",
         json.dumps({"server": replicated["front"], "key": API_KEY, "count": 10_000,
                     "concurrency": 3, "max_tokens": 48, "progress": str(progress),
                     "stop": str(stop)})],
        env=deployment.env(a),
        log=deployment.root / "chats.log",
    )  # fmt: skip

    def answered() -> int:
        return len(progress.read_text().split()) if progress.exists() else 0

    wait_until(lambda: answered() >= 3, "chats")
    hosts.link_down(b)
    try:
        out_after = wait_until(
            lambda: not front_replicas(replicated, hosts)[1]["up"], "b taken out", timeout=60
        )
        routed_while_out = front_replicas(replicated, hosts)[1]["requests_routed"]
    finally:
        hosts.link_up(b)
    back_after = wait_until(lambda: front_replicas(replicated, hosts)[1]["up"], "b taken back")
    state = front_replicas(replicated, hosts)[1]
    assert state["taken_back"] == 1
    # Host c killed whole: its server gone, its address still there (connections refused).
    deployment.network.kill_host(c)
    wait_until(lambda: not front_replicas(replicated, hosts)[2]["up"], "c taken out", timeout=60)
    enough = answered() + 6
    wait_until(lambda: answered() >= enough, "chats after c went")
    stop.touch()
    driver.wait(240)
    answer = answer_of((deployment.root / "chats.log").read_text(), "")
    assert answer.get("failed") == [] and answer["answered"] == answer["recorded"], answer
    replicas = answer["replicas"]
    assert replicas[1]["requests_routed"] > routed_while_out, "b served again after its return"
    print(f"b out after {out_after:.1f} s of cut, back {back_after:.1f} s after the cable; "
          f"failed by take-out: {[r['requests_failed_by_takeout'] for r in replicas]}")  # fmt: skip
