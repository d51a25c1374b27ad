"""A live Tinker training run to fuzz: a real server, a run on it, the SDK's own requests
aimed at it, and the checks every answer must pass.

`LiveRun.send` posts a body (with and without the key, on a keyed server) and records what is
wrong with the answer: a 5xx, an error not in the SDK's shape `{"detail": str}`, an operation's
future that fails as the server's fault ("server") or never finishes though its turn came, and a
refusal that did not take the run's seq_id it carried (the run's next operation then waits
forever: `probe`). Tests read `failures` (`report`). `live_server` starts it all; the JSON body
mutations (`mutated`: a field removed or replaced by one of `REPLACEMENTS`; `WHOLE_BODIES`) and
the hypothesis settings (`fuzz_settings`) are shared by the fuzz of every JSON route.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, settings
from tinker import types

from art_backend.tinker import _futures
from art_backend.tinker._proto import decode_forward_backward
from tests.support import tinker_bodies as wire
from tests.support.servers import RunningServer, running_server

# An operation that has its turn finishes in well under this on the tiny model; one that
# waits longer waits for a turn that never comes.
TURN_DEADLINE_SECONDS = 30.0
PROBE_DEADLINE_SECONDS = 10.0  # a two-token forward pass on the tiny model: milliseconds
PROTOBUF = "application/x-protobuf"
ORDERED_ROUTES = {"optim_step", "save_weights", "save_weights_for_sampler", "load_weights"}
LONG_POLL_SECONDS = 0.2  # the server's wait per retrieve_future, shortened for the polling

# ------------------------------------------------------------------------------- the live run


@contextlib.contextmanager
def live_server(model_dir: Path, art_path: Path, api_key: str | None) -> Iterator[LiveRun]:
    """A server of its own (keyed when `api_key`), with a live run and what bodies name."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_futures, "LONG_POLL_SECONDS", LONG_POLL_SECONDS)
        with (
            running_server(model_dir, art_path, api_key=api_key) as server,
            httpx.Client(base_url=server.url, timeout=120) as http,
        ):
            yield start_live_run(LiveRun(server, http))


@dataclass
class LiveRun:
    """A server with a training run, a saved state, sampler weights and a sampling session,
    and the run's next seq_id; it sends requests and reports what is wrong with the answers."""

    server: RunningServer
    http: httpx.Client
    session_id: str = ""
    model_id: str = ""
    state_path: str = ""
    sampler_path: str = ""
    sampling_session_id: str = ""
    next_seq_id: int = 1
    new_runs: int = 0  # model_seq_ids handed out for new runs
    wedges: int = 0  # runs found wedged by the current test
    failures: list[str] = field(default_factory=list)

    def begin(self) -> None:
        """A new test: no failures yet."""
        self.failures.clear()
        self.wedges = 0

    def headers(self, keyed: bool = True) -> dict[str, str]:
        """The SDK's key header, when the server has a key."""
        key = self.server.api_key
        return {"X-API-Key": key} if key and keyed else {}

    def post(
        self, route: str, content: bytes, content_type: str, keyed: bool = True
    ) -> httpx.Response:
        """POST a body as the SDK does (with the key unless not `keyed`)."""
        headers = {"content-type": content_type, **self.headers(keyed)}
        try:
            return self.http.post(f"/api/v1/{route}", content=content, headers=headers)
        except httpx.TransportError:
            # After a 500 the server closes the connection the client keeps for the next request.
            return self.http.post(f"/api/v1/{route}", content=content, headers=headers)

    def call(self, route: str, body: dict[str, Any]) -> Any:
        """A valid request, settled: its answer's body (a future's result: JSON or protobuf)."""
        response = self.post(route, json.dumps(body).encode(), "application/json")
        assert response.status_code == 200, (route, response.text)
        answer = response.json()
        if "request_id" in answer and route != "retrieve_future":
            result = self.settle(answer["request_id"], TURN_DEADLINE_SECONDS)
            served = isinstance(result, bytes) or (
                isinstance(result, dict) and "error" not in result
            )
            assert served, (route, result)
            return result
        return answer

    def settle(self, request_id: str, wait: float) -> dict[str, Any] | bytes | str | None:
        """The future's result (JSON or protobuf bytes), a problem as a string, or None when
        it is still running after `wait` seconds."""
        deadline = time.monotonic() + wait
        while True:
            response = self.post(
                "retrieve_future",
                json.dumps({"request_id": request_id}).encode(),
                "application/json",
            )
            if response.status_code != 200:
                return f"retrieve_future answered {response.status_code} {response.text[:300]}"
            if response.headers.get("content-type", "").startswith(PROTOBUF):
                return response.content
            result = response.json()
            if result.get("type") != "try_again":
                return result
            if time.monotonic() > deadline:
                return None

    def take_seq_id(self) -> int:
        """The run's next seq_id, handed to one request."""
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def probe(self, after: str) -> None:
        """A forward pass with the run's next seq_id must finish: the run is not wedged."""
        seq_id = self.take_seq_id()
        body = wire.forward_backward(
            self.model_id,
            seq_id,
            [wire.datum([3, 4], {"target_tokens": wire.tensor([4, 3], wire.INT64)})],
            "cross_entropy",
            forward_only=True,
        )
        response = self.post("forward_backward", body, PROTOBUF)
        if response.status_code != 200:
            self.failures.append(f"probe after {after}: {response.status_code} {response.text}")
            return
        # Once a wedge is found the test fails anyway: later probes wait less for theirs.
        wait = PROBE_DEADLINE_SECONDS if not self.wedges else 2.0
        result = self.settle(response.json()["request_id"], wait)
        if result is None:
            self.wedges += 1
            self.failures.append(
                f"{after}: refused without taking its turn (seq_id {seq_id - 1}); the run's "
                f"next operation (seq_id {seq_id}) waits forever"
            )
            self.model_id, self.next_seq_id = self.create_run(), 1  # the wedged one is lost
        elif not isinstance(result, bytes):
            self.failures.append(f"probe (seq_id {seq_id}) after {after}: {result}")

    def create_run(self) -> str:
        """A new training run (LoRA rank 4): its model id."""
        request = types.CreateModelRequest(
            session_id=self.session_id,
            model_seq_id=self.new_seq(),
            base_model="tiny",
            lora_config=types.LoraConfig(rank=4),
        )
        return self.call("create_model", wire.sdk_body(request))["model_id"]

    def new_seq(self) -> int:
        """A model_seq_id no run of this session has had (each new run needs its own)."""
        self.new_runs += 1
        return self.new_runs

    def send(
        self, label: str, route: str, content: bytes, content_type: str, turn: int | None
    ) -> None:
        """Send a (mutated) body; record what is wrong with the answer. `turn`: the run's seq_id
        the body carries readably (it must be taken, whatever the answer), None if none."""
        if self.server.api_key:
            self._check_refused_without_key(label, route, content, content_type)
        response = self.post(route, content, content_type)
        problem = answer_problem(response)
        if problem:
            self.failures.append(f"{label}: {problem}")
        elif response.status_code == 200 and route != "retrieve_future":
            answer = response.json() if "json" in response.headers["content-type"] else {}
            if isinstance(answer, dict) and "request_id" in answer:
                self._check_future(label, answer["request_id"], turn is not None)
        if turn is not None and response.status_code >= 400:
            self.probe(after=label)

    def _check_future(self, label: str, request_id: str, has_turn: bool) -> None:
        # An operation with a seq_id far ahead of the run's waits for its turn (by design): a
        # short look at it; any other must finish.
        result = self.settle(request_id, TURN_DEADLINE_SECONDS if has_turn else 1.0)
        if isinstance(result, str):
            self.failures.append(f"{label}: {result}")
        elif result is None and has_turn:
            self.failures.append(f"{label}: its future never finished (its turn came)")
        elif isinstance(result, dict) and result.get("category", "user") != "user":
            self.failures.append(f"{label}: a {result.get('category')!r} failure: {result}")

    def _check_refused_without_key(
        self, label: str, route: str, content: bytes, content_type: str
    ) -> None:
        response = self.post(route, content, content_type, keyed=False)
        if response.status_code != 401 or not is_detail(response):
            self.failures.append(
                f"{label} without the key: {response.status_code} {response.text[:300]}"
            )


def answer_problem(response: httpx.Response) -> str | None:
    """What is wrong with a direct answer: a 5xx, or an error not in the SDK's shape."""
    if response.status_code >= 500:
        return f"{response.status_code} {response.text[:500]}"
    if response.status_code >= 400 and not is_detail(response):
        return f"{response.status_code} not {{'detail': str}}: {response.text[:300]}"
    return None


def is_detail(response: httpx.Response) -> bool:
    """The body is `{"detail": str}`, as the SDK reads an error."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and set(body) == {"detail"} and isinstance(body["detail"], str)


def report(run: LiveRun) -> None:
    """Fail with every problem the test's requests found, one a line."""
    if run.failures:
        pytest.fail(f"{len(run.failures)} bad answers:\n" + "\n".join(run.failures), pytrace=False)


def start_live_run(run: LiveRun) -> LiveRun:
    """The SDK's own requests, each served: a session, a run, a state, sampler weights and a
    sampling session on the base model."""
    session = types.CreateSessionRequest(tags=["fuzz"], user_metadata=None, sdk_version="0.38.0")
    run.session_id = run.call("create_session", wire.sdk_body(session))["session_id"]
    run.model_id = run.create_run()
    saved = types.SaveWeightsRequest(model_id=run.model_id, path="kept", seq_id=run.take_seq_id())
    run.state_path = run.call("save_weights", wire.sdk_body(saved))["path"]
    sampler = types.SaveWeightsForSamplerRequest(
        model_id=run.model_id, path="kept", seq_id=run.take_seq_id()
    )
    run.sampler_path = run.call("save_weights_for_sampler", wire.sdk_body(sampler))["path"]
    sampling = types.CreateSamplingSessionRequest(
        session_id=run.session_id, sampling_session_seq_id=0, base_model="tiny"
    )
    answer = run.call("create_sampling_session", wire.sdk_body(sampling))
    run.sampling_session_id = answer["sampling_session_id"]
    return run


def sdk_request(run: LiveRun, route: str, seq_id: int) -> Any:
    """The SDK's request for `route`, aimed at the live run (`seq_id` where it takes one)."""
    name = f"fuzz-{seq_id}"
    requests: dict[str, Any] = {
        "create_session": lambda: types.CreateSessionRequest(
            tags=["a"], user_metadata={"k": "v"}, sdk_version="0.38.0", project_id="p"
        ),
        "session_heartbeat": lambda: types.SessionHeartbeatRequest(session_id=run.session_id),
        "create_model": lambda: types.CreateModelRequest(
            session_id=run.session_id,
            model_seq_id=run.new_seq(),
            base_model="tiny",
            user_metadata={"k": "v"},
            lora_config=types.LoraConfig(rank=2, seed=1),
        ),
        "get_info": lambda: types.GetInfoRequest(model_id=run.model_id),
        "optim_step": lambda: types.OptimStepRequest(
            adam_params=types.AdamParams(learning_rate=1e-5, grad_clip_norm=1.0),
            model_id=run.model_id,
            seq_id=seq_id,
        ),
        "save_weights": lambda: types.SaveWeightsRequest(
            model_id=run.model_id, path=name, seq_id=seq_id
        ),
        "load_weights": lambda: types.LoadWeightsRequest(
            model_id=run.model_id, path=run.state_path, seq_id=seq_id, optimizer=True
        ),
        "save_weights_for_sampler": lambda: types.SaveWeightsForSamplerRequest(
            model_id=run.model_id, path=name, seq_id=seq_id
        ),
        "create_sampling_session": lambda: types.CreateSamplingSessionRequest(
            session_id=run.session_id, sampling_session_seq_id=1, model_path=run.sampler_path
        ),
        "asample": lambda: types.SampleRequest(
            prompt=types.ModelInput.from_ints([3, 4, 5]),
            sampling_params=types.SamplingParams(max_tokens=2, seed=1, stop=["x"]),
            sampling_session_id=run.sampling_session_id,
            seq_id=seq_id,
        ),
        "retrieve_future": lambda: types.FutureRetrieveRequest(request_id="req-" + "0" * 32),
    }
    return requests[route]()


def valid_forward_backward(run: LiveRun, seq_id: int) -> bytes:
    """What the SDK sends for a ppo step on one datum (both config maps written)."""
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    return wire.forward_backward(
        run.model_id, seq_id, [wire.policy_datum([3, 4, 5])], "ppo", config
    )


def decoded_turn(run: LiveRun, body: bytes, seq_id: int) -> int | None:
    """The run's seq_id a protobuf body carries, read as the server reads it (None when it
    does not decode, or names another run or seq_id)."""
    try:
        decoded = decode_forward_backward(body)
    except Exception:  # noqa: BLE001 - what the server's decoder refuses, however
        return None
    return seq_id if (decoded.model_id, decoded.seq_id) == (run.model_id, seq_id) else None


def send_forward_backward(run: LiveRun, label: str, body: bytes, turn: int | None) -> None:
    """Send a forward_backward body, its turn taken from the run's count when it carries one."""
    if turn is not None:
        run.take_seq_id()
    run.send(label, "forward_backward", body, PROTOBUF, turn)


# ----------------------------------------------------------------------- JSON body mutations

REMOVED = "removed"
REPLACEMENTS: dict[str, Any] = {
    "a string": "fuzz",
    "an unknown path": "tinker://tinker-0000/sampler_weights/none",
    "true": True,
    "null": None,
    "2**70": 2**70,
    "-1": -1,
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
    "an object": {"fuzz": [1]},
    "a list": ["fuzz", 1],
    "a deep nesting": wire.DEEP,
    "a 1 MB string": "x" * 1_000_000,
    "a lone surrogate": "\ud800",
}
WHOLE_BODIES: dict[str, bytes] = {
    "an empty body": b"",
    "not JSON": b'{"model_id": ',
    "a JSON array": b"[1, 2]",
    "a JSON string": b'"fuzz"',
    "JSON null": b"null",
    "not UTF-8": b'{"model_id": "\xff\xfe"}',
    "a deep nesting": wire.json_text(wire.DEEP),
    "NaN": b"NaN",
}


def field_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field of a body, nested ones and a list's first item included."""
    paths: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value[:1])
    for name, inner in items:
        paths.append((*prefix, name))
        if isinstance(inner, dict | list) and inner:
            paths += field_paths(inner, (*prefix, name))
    return paths


def mutated(body: dict[str, Any], path: tuple[Any, ...], change: str) -> dict[str, Any]:
    """A copy of `body` with the field at `path` removed or replaced."""
    copy = json.loads(json.dumps(body))
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    if change == REMOVED:
        del parent[path[-1]]
    else:
        parent[path[-1]] = REPLACEMENTS[change]
    return copy


def fuzz_settings(examples: int) -> settings:
    """Hypothesis for the fuzz: derandomized (the same requests every run), `examples` of them,
    no deadline (a request's time is the server's) and no example database."""
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
