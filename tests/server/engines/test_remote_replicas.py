"""Engine replicas on other servers: `art-server --replica-url URL` in front of another
`art-server --replica-api` (here both on 127.0.0.1; tests/netns runs them on separate hosts).

The replica decodes what the front routes to it, token for token what the front's own engine
gives; an adapter the front loads reaches the replica as files; a replica whose /health stops
answering is taken out and taken back once it answers, with the adapters served meanwhile; a
replica of another vocabulary, or one without the engine routes, fails the start by name; the
engine routes refuse bad requests with a 4xx saying what to change.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from art_backend.engines._remote_engine import RemoteEngine
from art_backend.engines._replicas import PROBE_FAILURES_TO_TAKE_OUT, ReplicaSet
from art_backend.testing import ModelLoadError
from tests.support.adapters import make_random_adapter, tar_of
from tests.support.servers import RunningServer, running_server

pytestmark = pytest.mark.torch_engine

KEY = "replica-key"


@pytest.fixture(scope="module")
def replica(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("art-replica")
    with running_server(tiny_model_dir, path, api_key=KEY, replica_api=True) as running:
        yield running


@pytest.fixture(scope="module")
def front(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, replica: RunningServer
) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("art-front")
    with running_server(
        tiny_model_dir, path, api_key=KEY, remote_replicas=(replica.url,)
    ) as running:
        yield running


def replicas(server: RunningServer) -> ReplicaSet:
    engine = server.service.engine
    assert isinstance(engine, ReplicaSet)
    return engine


def greedy(server: RunningServer, rollout_id: str, model: str = "tiny") -> tuple[int, list[str]]:
    """Which replica answered a greedy chat with two choices, and the choices' texts."""
    before = [r["requests_routed"] for r in replicas(server).replica_states()]
    client = openai.OpenAI(
        base_url=f"{server.url}/rollouts/{rollout_id}/v1", api_key=KEY, max_retries=0
    )
    response = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to ten."}],
        max_tokens=12,
        temperature=0,
        n=2,
    )
    after = [r["requests_routed"] for r in replicas(server).replica_states()]
    [index] = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
    return index, [choice.message.content or "" for choice in response.choices]


def answers_by_replica(server: RunningServer, model: str = "tiny") -> dict[int, list[str]]:
    """Greedy answers until both replicas gave one (new rollouts alternate between them)."""
    answers: dict[int, list[str]] = {}
    for _ in range(6):
        index, texts = greedy(server, f"r-{uuid.uuid4().hex[:8]}", model)
        answers.setdefault(index, texts)
        if len(answers) == 2:
            return answers
    raise AssertionError(f"the requests did not reach both replicas: {answers}")


def test_the_replica_decodes_what_the_front_decodes(front: RunningServer, replica: RunningServer):
    health = httpx.get(f"{front.url}/health").json()
    assert [(r["engine"], r["up"]) for r in health["replicas"]] == [
        ("torch", True),
        ("remote", True),
    ]
    answers = answers_by_replica(front)
    assert answers[0] == answers[1] and answers[0][0]
    assert replica.service.engine.metrics.requests_total >= 1
    rollout_id = f"recorded-{uuid.uuid4().hex[:8]}"
    while greedy(front, rollout_id)[0] != 1:  # until the replica answered it
        rollout_id = f"recorded-{uuid.uuid4().hex[:8]}"
    url = f"/v1/rollouts/{rollout_id}"
    records = httpx.get(f"{front.url}{url}", headers=front.headers()).json()["completions"]
    assert len(records) == 1, "the front records what the replica decoded"
    assert not httpx.get(f"{replica.url}{url}", headers=replica.headers()).json()["completions"]


def test_an_adapter_the_front_loads_reaches_the_replica_as_files(
    front: RunningServer, replica: RunningServer, tiny_model_dir: Path
):
    folder = make_random_adapter(tiny_model_dir, front.art_path / "sent", seed=5)
    response = httpx.post(
        f"{front.url}/v1/adapters",
        json={"name": "sent@1", "path": str(folder)},
        headers=front.headers(),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert "sent@1" in replica.service.engine.adapters
    copies = list((replica.art_path / "replica-adapters").glob("sent@1.*"))
    assert len(copies) == 1 and {p.name for p in copies[0].iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    answers = answers_by_replica(front, "sent@1")
    assert answers[0] == answers[1]
    assert answers[0] != answers_by_replica(front)[0]  # the adapter changes what is decoded

    replicas(front).unload_adapter("sent@1")
    assert "sent@1" not in replica.service.engine.adapters
    assert not list((replica.art_path / "replica-adapters").glob("sent@1.*"))


def test_a_replica_that_stops_answering_is_taken_out_and_back_with_the_adapters(
    front: RunningServer, replica: RunningServer, tiny_model_dir: Path
):
    engines = replicas(front)
    remote = engines.replicas[1]
    probe = remote.probe
    assert probe is not None
    # The servers are the module's: on a loaded machine the background health check may have
    # taken the replica out and back before this test (a probe past its timeout).
    taken_back = engines.replica_states()[1]["taken_back"]
    remote.probe = lambda: "no answer (the test cut it)"
    try:
        for _ in range(PROBE_FAILURES_TO_TAKE_OUT):
            engines.check_health()
        assert engines.replica_states()[1]["up"] is False
        for _ in range(3):  # everything goes to the front's own engine meanwhile
            assert greedy(front, f"out-{uuid.uuid4().hex[:8]}")[0] == 0
        # A step served while the replica is out, and one withdrawn: it learns both on return.
        folder = make_random_adapter(tiny_model_dir, front.art_path / "while-out", seed=6)
        engines.load_adapter("while-out@1", folder)
        replica.service.engine.load_adapter("stale@1", folder)  # what the front no longer serves
        remote.engine.adapters["stale@1"] = "stale@1"
        engines.check_health()
        assert engines.replica_states()[1]["up"] is False  # still failing: stays out
    finally:
        remote.probe = probe
    engines.check_health()
    state = engines.replica_states()[1]
    assert state["up"] is True and state["taken_back"] == taken_back + 1
    assert "while-out@1" in replica.service.engine.adapters
    assert "stale@1" not in replica.service.engine.adapters
    assert set(answers_by_replica(front, "while-out@1")) == {0, 1}
    engines.unload_adapter("while-out@1")


def test_a_replica_of_another_vocabulary_or_without_the_routes_fails_the_start(
    replica: RunningServer, front: RunningServer, tiny_model_dir: Path
):
    other = AutoTokenizer.from_pretrained(tiny_model_dir)
    other.add_tokens(["<not-in-the-replica>"])
    with pytest.raises(ModelLoadError, match="another vocabulary"):
        RemoteEngine(replica.url, other, api_key=KEY).start()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ModelLoadError, match="--replica-api"):
        RemoteEngine(front.url, tokenizer, api_key=KEY).start()  # the front lends no engine
    with pytest.raises(ModelLoadError, match="HTTP 401"):
        RemoteEngine(replica.url, tokenizer, api_key="wrong").start()
    with pytest.raises(ModelLoadError, match="did not answer"):
        RemoteEngine("http://127.0.0.1:9", tokenizer, start_timeout=0.5).start()


def generate(server: RunningServer, body: dict, **options) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/engine/generate", json=body, headers=server.headers(), **options
    )


def test_the_engine_routes_refuse_bad_requests_by_name(replica: RunningServer):
    engine = replica.service.engine
    good = {"prompt_ids": [1, 2, 3], "params": {"max_new_tokens": 4}}
    answered = generate(replica, good)
    assert answered.status_code == 200
    lines = answered.text.splitlines()
    assert len(lines) == 5 and '"finish"' in lines[-1]
    cases = {
        "prompt_ids": {**good, "prompt_ids": [engine.vocab_size]},
        "params.max_new_tokens": {**good, "params": {"max_new_tokens": engine.context_length}},
        "adapter": {**good, "adapter": "missing@1"},
        "temperature": {**good, "params": {"max_new_tokens": 2, "temperature": 7.0}},
        "grammar": {**good, "params": {"max_new_tokens": 2, "grammar": "start: @@"}},
        "extra": {**good, "tools": []},
        "n": {**good, "n": 0},
    }
    for label, body in cases.items():
        response = generate(replica, body)
        assert response.status_code in (400, 404), (label, response.text)
        assert response.json()["error"]["message"], label
    assert httpx.post(f"{replica.url}/v1/engine/generate", json=good).status_code == 401


def test_the_adapter_route_takes_only_the_adapters_two_files(replica: RunningServer):
    url = f"{replica.url}/v1/engine/adapters"
    tar = {**replica.headers(), "Content-Type": "application/x-tar"}
    bodies = {
        "a path out of the folder": tar_of({"../adapter_config.json": b"{}"}),
        "another file": tar_of({"adapter_config.json": b"{}", "run.sh": b"echo"}),
        "a file missing": tar_of({"adapter_config.json": b"{}"}),
        "not a tar": b"not a tar at all",
        "a config that is not LoRA": tar_of(
            {"adapter_config.json": b"{}", "adapter_model.safetensors": b"x"}
        ),
    }
    for label, body in bodies.items():
        response = httpx.put(f"{url}/ok@1", content=body, headers=tar)
        assert response.status_code == 400, (label, response.text)
    response = httpx.put(f"{url}/ok@1", content=b"{}", headers=replica.headers())
    assert response.status_code == 400 and "application/x-tar" in response.text
    assert httpx.put(f"{url}/..@1", content=b"", headers=tar).status_code in (400, 404)
    assert httpx.delete(f"{url}/never@1", headers=replica.headers()).status_code == 404
    assert not list((replica.art_path / "replica-adapters").glob("ok@1*"))


def test_two_health_checks_at_once_take_a_replica_back_once(
    front: RunningServer, replica: RunningServer
):
    # The watcher thread and a caller may both find the replica out and its probe passing.
    engines = replicas(front)
    remote = engines.replicas[1]
    engines._take_out(1, "the test took it out", returns=True)
    taken_back = engines.replica_states()[1]["taken_back"]
    probe = remote.probe
    assert probe is not None
    both_probed = threading.Barrier(2)
    checks = [threading.Thread(target=engines._try_take_back, args=(1,)) for _ in range(2)]

    def slow_probe() -> str | None:
        if threading.current_thread() in checks:  # not the watcher's: a third party breaks it
            both_probed.wait(timeout=10)  # both checks past the probe before either takes it back
        return probe()

    remote.probe = slow_probe
    try:
        for check in checks:
            check.start()
        for check in checks:
            check.join(timeout=60)
    finally:
        remote.probe = probe
    state = engines.replica_states()[1]
    assert state["up"] is True and state["taken_back"] == taken_back + 1


def test_a_probe_that_raises_takes_the_replica_out_by_its_error_and_the_watcher_lives(
    front: RunningServer,
):
    engines = replicas(front)
    remote = engines.replicas[1]
    probe = remote.probe
    assert probe is not None
    taken_back = engines.replica_states()[1]["taken_back"]

    def raising_probe() -> str | None:
        raise OSError("the probe's socket broke")

    remote.probe = raising_probe
    try:
        for _ in range(PROBE_FAILURES_TO_TAKE_OUT):
            engines.check_health()  # raised out of here, and ended the watcher, before
        state = engines.replica_states()[1]
        assert state["up"] is False
        assert "raised OSError: the probe's socket broke" in state["error"]
        engines.check_health()  # a replica taken out by its probe: the take-back probes again
        assert engines.replica_states()[1]["up"] is False
    finally:
        remote.probe = probe
    engines.check_health()
    assert engines.replica_states()[1]["up"] is True
    assert engines.replica_states()[1]["taken_back"] == taken_back + 1
    assert engines._monitor.is_alive()
