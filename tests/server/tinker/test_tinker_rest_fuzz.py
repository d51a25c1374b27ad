"""The Tinker API's REST calls fuzzed like its other routes: a clear refusal, never a 5xx.

Every REST route (`art_backend.tinker._rest_routes`) is called as the SDK's `RestClient` calls
it, aimed at a live run's state and sampler weights, and then with what a user or a hostile
client sends instead: the JSON bodies (weights_info, ttl) mutated as in test_tinker_fuzz.py;
each path segment replaced by a hostile one (a malformed tinker path, another run's id, an
encoded `..` or slash, not UTF-8, a lone surrogate, 8,000 characters); `limit` and `offset`
negative, huge, not numbers. Every answer is under 500, an error is `{"detail": str}`, a success
parses as the SDK's response type, and a keyed server answers 401 without its key.

Then the sequences a user gets wrong (delete twice; publish, unpublish, ttl, weights info, load
or sample of a deleted checkpoint; publish twice; an unknown session) each get the 4xx that
names what is wrong; and the races a user can start: a load queued before its state is deleted,
a sample in flight while its sampler weights are deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

from tests.support import tinker_bodies as wire  # noqa: E402
from tests.support.tinker_fuzz import (  # noqa: E402
    REMOVED,
    REPLACEMENTS,
    WHOLE_BODIES,
    LiveRun,
    answer_problem,
    field_paths,
    fuzz_settings,
    is_detail,
    live_server,
    mutated,
    report,
)

API_KEY = "tml-rest-fuzz-key"
EXAMPLES_PER_BODY = 25
ONE = "training_runs/{model_id}/checkpoints/{kind}/{name}"
# Each REST route (method, path) and the SDK type of its answer (None: it answers null).
ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "training_runs", types.TrainingRunsResponse),
    ("GET", "training_runs/{model_id}", types.TrainingRun),
    ("GET", "training_runs/{model_id}/checkpoints", types.CheckpointsListResponse),
    ("GET", "checkpoints", types.CheckpointsListResponse),
    ("POST", "weights_info", types.WeightsInfoResponse),
    ("DELETE", ONE, None),
    ("POST", f"{ONE}/publish", None),
    ("DELETE", f"{ONE}/publish", None),
    ("PUT", f"{ONE}/ttl", None),
    ("GET", "sessions", types.ListSessionsResponse),
    ("GET", "sessions/{session_id}", types.GetSessionResponse),
]
PAGED = {
    "training_runs": types.TrainingRunsResponse,
    "checkpoints": types.CheckpointsListResponse,
    "sessions": types.ListSessionsResponse,
}
# Path segments as sent (percent-encoded where a client would encode them); `{other_run}` and
# `{session_id}` are filled in. None is ever a live checkpoint's kind or name: the fuzz deletes
# nothing it aims at.
HOSTILE_SEGMENTS = {
    "an encoded ..": "%2e%2e",
    "an encoded .": "%2e",
    "an encoded slash": "a%2Fb",
    "an encoded slash alone": "%2F",
    "a NUL": "%00",
    "bytes that are not UTF-8": "%ff%fe",
    "a lone surrogate in UTF-8": "%ED%A0%80",
    "a lone surrogate escaped": "%5Cud800",
    "8,000 characters": "x" * 8000,
    "a whole tinker path": "tinker:%2F%2Ftinker-0000%2Fweights%2Fkept",
    "another run's id": "{other_run}",
    "a session id": "{session_id}",
    "a space": "%20",
    "an encoded ?": "%3F",
    "an encoded %": "%25",
    "a negative number": "-1",
    "a huge number": "9" * 30,
    "a right-to-left override": "%E2%80%AE",
}
HOSTILE_NUMBERS = {
    "negative": "-1",
    "zero": "0",
    "-2**70": str(-(2**70)),
    "2**63": str(2**63),
    "2**70": str(2**70),
    "not a number": "abc",
    "a fraction": "1.5",
    "empty": "",
    "NaN": "NaN",
    "an exponent": "1e3",
    "hexadecimal": "0x10",
    "a NUL": "%00",
    "5,000 digits": "9" * 5000,
    "a lone surrogate in UTF-8": "%ED%A0%80",
}


@pytest.fixture(scope="module", params=[None, API_KEY], ids=["open", "keyed"])
def live(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveRun]:
    """A server of its own with a live run: a saved state and sampler weights, both `kept`."""
    path = tmp_path_factory.mktemp("art-tinker-rest-fuzz")
    with live_server(tiny_model_dir, path, request.param) as run:
        yield run


@pytest.fixture(scope="module")
def other_run(live: LiveRun) -> str:
    """A second run of the server's, with no checkpoints."""
    return live.create_run()


def route_path(live: LiveRun, template: str, **segments: str) -> str:
    """`template` aimed at the live run's state, unless `segments` say otherwise."""
    aimed = {"model_id": live.model_id, "kind": "weights", "name": "kept"}
    return template.format(**{**aimed, "session_id": live.session_id, **segments})


def body_of(method: str, path: str, live: LiveRun) -> bytes | None:
    """The body the SDK sends on this route (None: it sends none)."""
    if path == "weights_info":
        return json.dumps({"tinker_path": live.state_path}).encode()
    return json.dumps({"ttl_seconds": 3600}).encode() if path.endswith("/ttl") else None


def send(
    live: LiveRun, label: str, method: str, path: str, content: bytes | None, answer: Any
) -> None:
    """One REST request (and, on a keyed server, the same without the key): what is wrong with
    the answers goes to `live.failures`. `answer`: the SDK's type of a 200 (None: null)."""
    url = f"/api/v1/{path}"
    headers = {"content-type": "application/json"} if content is not None else {}
    if live.server.api_key:
        response = live.http.request(method, url, content=content, headers=headers)
        if response.status_code != 401 or not is_detail(response):
            live.failures.append(
                f"{label} without the key: {response.status_code} {response.text[:300]}"
            )
    response = live.http.request(
        method, url, content=content, headers={**headers, **live.headers()}
    )
    problem = answer_problem(response) or not_the_sdks_answer(response, answer)
    if problem:
        live.failures.append(f"{label}: {problem}")


def not_the_sdks_answer(response: httpx.Response, answer: Any) -> str | None:
    """What keeps the SDK from reading a 200 as the route's response type."""
    if response.status_code != 200:
        return None
    try:
        if answer is None:
            assert response.json() is None, "not null"
        else:
            answer.model_validate(response.json())
    except (AssertionError, ValueError) as error:
        return f"a 200 the SDK cannot read ({error}): {response.text[:300]}"
    return None


# ------------------------------------------------------------------------- the SDK's own


def test_the_sdks_own_rest_calls_are_served(live: LiveRun, other_run: str):
    """The fuzz starts from calls the server serves: the SDK's RestClient, on the live run."""
    rest = tinker.RestClient(base_url=live.server.url, api_key=live.server.api_key or API_KEY)
    state, sampler = live.state_path, live.sampler_path
    assert rest.list_training_runs().result().cursor.total_count >= 2
    assert rest.get_training_run(live.model_id).result().training_run_id == live.model_id
    listed = rest.list_checkpoints(live.model_id).result().checkpoints
    assert {one.tinker_path for one in listed} == {state, sampler}
    assert rest.list_user_checkpoints().result().checkpoints
    assert rest.get_weights_info_by_tinker_path(state).result().lora_rank == 4
    rest.set_checkpoint_ttl_from_tinker_path(sampler, 3600).result()
    rest.set_checkpoint_ttl_from_tinker_path(sampler, None).result()
    rest.publish_checkpoint_from_tinker_path(state).result()
    rest.unpublish_checkpoint_from_tinker_path(state).result()
    assert live.session_id in rest.list_sessions().result().sessions
    assert other_run in rest.get_session(live.session_id).result().training_run_ids


# ---------------------------------------------------------------------------------- fuzz


@pytest.mark.parametrize("route", ["weights_info", f"{ONE}/ttl"])
def test_mutated_rest_json_bodies_get_no_5xx(live: LiveRun, route: str):
    live.begin()
    method = "POST" if route == "weights_info" else "PUT"
    answer = types.WeightsInfoResponse if method == "POST" else None
    path = route_path(live, route)
    body = json.loads(body_of(method, path, live) or b"{}")
    one_field = st.tuples(
        st.sampled_from(field_paths(body)), st.sampled_from([REMOVED, *REPLACEMENTS])
    )
    whole = st.tuples(st.just(()), st.sampled_from(sorted(WHOLE_BODIES)))

    @given(mutation=st.one_of(one_field, one_field, whole))
    @fuzz_settings(EXAMPLES_PER_BODY)
    def call(mutation: tuple[tuple[Any, ...], str]) -> None:
        field, change = mutation
        content = wire.json_text(mutated(body, field, change)) if field else WHOLE_BODIES[change]
        label = f"{method} {route} with {'.'.join(map(str, field)) or 'the body'} {change}"
        send(live, label, method, path, content, answer)

    call()
    report(live)


def test_hostile_path_segments_get_no_5xx(live: LiveRun, other_run: str):
    live.begin()
    for method, template, answer in ROUTES:
        for segment in [
            name for name in ("model_id", "kind", "name", "session_id") if name in template
        ]:
            for label, hostile in HOSTILE_SEGMENTS.items():
                value = hostile.format(other_run=other_run, session_id=live.session_id)
                path = route_path(live, template, **{segment: value})
                label = f"{method} {template} with {segment} {label}"
                send(live, label, method, path, body_of(method, path, live), answer)
    report(live)


def test_hostile_limits_and_offsets_get_no_5xx(live: LiveRun):
    live.begin()
    for route, answer in PAGED.items():
        for parameter in ("limit", "offset"):
            for label, value in HOSTILE_NUMBERS.items():
                path = f"{route}?{parameter}={value}"
                send(live, f"GET {route} with {parameter} {label}", "GET", path, None, answer)
        twice = f"{route}?limit=1&limit=-1"
        send(live, f"GET {route} with limit twice", "GET", twice, None, answer)
    report(live)


# ---------------------------------------------------------------- what a user gets wrong


def rest_answer(live: LiveRun, method: str, path: str, body: Any = None) -> httpx.Response:
    """A REST request with the key (and `body` as JSON)."""
    content = None if body is None else json.dumps(body).encode()
    return live.http.request(
        method,
        f"/api/v1/{path}",
        content=content,
        headers={"content-type": "application/json", **live.headers()},
    )


def saved(live: LiveRun, route: str, name: str) -> str:
    """A new checkpoint of the live run (`save_weights` or `save_weights_for_sampler`): its path."""
    request = {"model_id": live.model_id, "path": name, "seq_id": live.take_seq_id()}
    return live.call(route, request)["path"]


def test_the_sequences_a_user_gets_wrong_get_a_4xx_that_names_what_is_wrong(live: LiveRun):
    state = saved(live, "save_weights", "doomed")
    sampler = saved(live, "save_weights_for_sampler", "doomed")
    session = {"session_id": live.session_id, "sampling_session_seq_id": 7, "model_path": sampler}
    sampling = live.call("create_sampling_session", session)["sampling_session_id"]
    run = f"training_runs/{live.model_id}/checkpoints"
    for path in (state, sampler):
        one = f"{run}/{path.split('/', 3)[3]}"
        gone = f"no checkpoint {path.split('/', 3)[3]!r}"
        steps = [
            ("DELETE", one, None, 200, ""),
            ("DELETE", one, None, 404, gone),
            ("POST", f"{one}/publish", None, 404, gone),
            ("DELETE", f"{one}/publish", None, 404, gone),
            ("PUT", f"{one}/ttl", {"ttl_seconds": 3600}, 404, gone),
            ("POST", "weights_info", {"tinker_path": path}, 404, gone),
        ]
        for method, route, body, status, named in steps:
            answer = rest_answer(live, method, route, body)
            assert answer.status_code == status, (method, route, answer.text)
            assert named in answer.text, (method, route, answer.text)
    loaded = {"model_id": live.model_id, "path": state, "seq_id": live.next_seq_id}
    assert rest_answer(live, "POST", "load_weights", loaded).status_code == 404
    live.take_seq_id()  # a refused operation takes its turn
    sample = {
        "sampling_session_id": sampling,
        "seq_id": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [3, 4]}]},
        "sampling_params": {"max_tokens": 1},
    }
    refused = rest_answer(live, "POST", "asample", sample)
    assert refused.status_code == 404 and "were deleted" in refused.text, refused.text
    session["sampling_session_seq_id"] = 8
    refused = rest_answer(live, "POST", "create_sampling_session", session)
    assert refused.status_code == 404 and "no sampler weights named 'doomed'" in refused.text

    kept = f"{run}/weights/kept/publish"
    assert rest_answer(live, "POST", kept).status_code == 200
    twice = rest_answer(live, "POST", kept)
    assert twice.status_code == 400 and "is public already" in twice.text, twice.text
    assert rest_answer(live, "DELETE", kept).status_code == 200
    twice = rest_answer(live, "DELETE", kept)
    assert twice.status_code == 400 and "is private already" in twice.text, twice.text
    unknown = rest_answer(live, "GET", "sessions/session-0000")
    assert unknown.status_code == 404 and "No session 'session-0000'" in unknown.text


def test_a_load_that_waited_for_its_turn_while_its_state_was_deleted_says_so(live: LiveRun):
    """Regression: the load failed saying the state did not fit this base model."""
    state = saved(live, "save_weights", "loaded-late")
    skipped, later = live.take_seq_id(), live.take_seq_id()
    load = {"model_id": live.model_id, "path": state, "seq_id": later, "optimizer": True}
    waiting = rest_answer(live, "POST", "load_weights", load).json()["request_id"]
    name = state.rsplit("/", 1)[1]
    one = f"training_runs/{live.model_id}/checkpoints/weights/{name}"
    assert rest_answer(live, "DELETE", one).status_code == 200
    step = {"model_id": live.model_id, "seq_id": skipped, "adam_params": {"learning_rate": 1e-5}}
    live.call("optim_step", step)  # the load's turn comes

    result = live.settle(waiting, 30)
    assert isinstance(result, dict), result
    assert result["category"] == "user" and f"{state} was deleted" in result["error"], result


def sample_body(session: str, max_tokens: int, samples: int) -> dict[str, Any]:
    """An asample request of a seeded, `max_tokens`-long generation."""
    return {
        "sampling_session_id": session,
        "seq_id": 1,
        "num_samples": samples,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [3, 4, 5]}]},
        "sampling_params": {"max_tokens": max_tokens, "seed": 7},
    }


def test_sampler_weights_deleted_mid_sample_let_it_finish_and_then_leave_disk(live: LiveRun):
    """Regression: the adapter was unloaded mid-generation, which failed the engine's whole
    batch as the server's fault (a base model's sample beside it too)."""
    sampler = saved(live, "save_weights_for_sampler", "mid-sample")
    tinker_state = live.server.app.state.tinker
    run = tinker_state.runs[live.model_id]
    folder = run.registered.store.checkpoint_dir(run.samplers["mid-sample"])
    saved(live, "save_weights_for_sampler", "after")  # `mid-sample` is not the latest step
    sessions = [
        {"session_id": live.session_id, "sampling_session_seq_id": 9, "model_path": sampler},
        {"session_id": live.session_id, "sampling_session_seq_id": 10, "base_model": "tiny"},
    ]
    ids = [live.call("create_sampling_session", one)["sampling_session_id"] for one in sessions]
    # Long enough (hundreds of decode steps) that the delete lands while they generate.
    futures = [
        rest_answer(live, "POST", "asample", sample_body(one, 300, 8)).json()["request_id"]
        for one in ids
    ]
    deleted = rest_answer(
        live, "DELETE", f"training_runs/{live.model_id}/checkpoints/sampler_weights/mid-sample"
    )

    assert deleted.status_code == 200, deleted.text
    results = [live.settle(one, 60) for one in futures]
    assert all(isinstance(result, bytes) for result in results), results
    assert not folder.exists()


def test_an_older_sampler_sampled_while_the_run_saves_new_ones_finishes(live: LiveRun):
    """Regression: a save unloaded the older step (the served window's trim) mid-generation."""
    older = saved(live, "save_weights_for_sampler", "older")
    for newer in range(3):  # the served window (2 steps) moves past `older`
        saved(live, "save_weights_for_sampler", f"newer-{newer}")
    session = {"session_id": live.session_id, "sampling_session_seq_id": 11, "model_path": older}
    sampling = live.call("create_sampling_session", session)["sampling_session_id"]
    future = rest_answer(live, "POST", "asample", sample_body(sampling, 300, 8)).json()
    saved(live, "save_weights_for_sampler", "newest")  # trims the window while it samples

    assert isinstance(live.settle(future["request_id"], 60), bytes)
