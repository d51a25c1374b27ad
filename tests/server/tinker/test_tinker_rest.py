"""The Tinker API's REST calls through the real `tinker` SDK's `RestClient`, on the tiny model.

A user's checkpoints across runs (newest first, paged), a checkpoint's weights info, deleting a
checkpoint (gone from disk and from the listings, its path no longer loads), publishing and
unpublishing (refused at once when it is so already), a TTL (out of its bounds a 400 naming ttl_seconds;
once run out, the checkpoint is deleted), and sessions listed with their runs and samplers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

from tests.support.servers import RunningServer, running_tinker_server  # noqa: E402

API_KEY = "tml-rest-key"
TOKENS = list(range(10, 22))
DATUM = types.Datum(
    model_input=types.ModelInput.from_ints(TOKENS[:-1]),
    loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * 11},
)
METADATA = {"purpose": "rest-tests"}


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("art-tinker-rest")
    with running_tinker_server(tiny_model_dir, path, api_key=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def service(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(user_metadata=METADATA, base_url=server.url, api_key=API_KEY)
    yield client
    client.close("success")


@pytest.fixture(scope="module")
def rest(server: RunningServer) -> tinker.RestClient:
    return tinker.RestClient(base_url=server.url, api_key=API_KEY)


def trained_run(service: tinker.ServiceClient) -> tinker.TrainingClient:
    """A run with one step: its checkpoints then hold trained weights."""
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    training.forward_backward([DATUM], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    return training


def paths(listed: list[types.Checkpoint]) -> list[str]:
    return [checkpoint.tinker_path for checkpoint in listed]


def test_a_users_checkpoints_are_every_runs_newest_first_and_paged(
    service: tinker.ServiceClient, rest: tinker.RestClient
):
    first, second = trained_run(service), trained_run(service)
    saved = [
        first.save_state("list-a").result().path,
        first.save_weights_for_sampler("list-b").result().path,
        second.save_state("list-c").result().path,
    ]
    everything = rest.list_user_checkpoints(limit=1000).result()
    listed = paths(everything.checkpoints)
    assert [listed.index(path) for path in reversed(saved)] == sorted(
        listed.index(path) for path in saved
    )
    assert everything.cursor is not None and everything.cursor.total_count == len(listed)
    page = rest.list_user_checkpoints(limit=2, offset=1).result()
    assert paths(page.checkpoints) == listed[1:3]

    info = rest.get_weights_info_by_tinker_path(saved[1]).result()
    assert (info.base_model, info.is_lora, info.lora_rank) == ("tiny", True, 4)
    assert info.train_attn and info.train_mlp and not info.train_unembed
    with pytest.raises(tinker.NotFoundError, match="no checkpoint 'weights/never-saved'"):
        rest.get_weights_info_by_tinker_path(
            f"tinker://{first.model_id}/weights/never-saved"
        ).result()


def test_a_deleted_checkpoint_is_gone_from_disk_and_listings(
    server: RunningServer, service: tinker.ServiceClient, rest: tinker.RestClient
):
    training = trained_run(service)
    state = training.save_state("doomed").result().path
    older = training.save_weights_for_sampler("older").result().path
    training.save_weights_for_sampler("newer").result()
    sampling_before = service.create_sampling_client(model_path=older).result()
    state_folder = server.app.state.tinker_checkpoints.states.saved[state].folder
    run = server.app.state.tinker.runs[training.model_id]
    older_folder = run.registered.store.checkpoint_dir(run.samplers["older"])
    assert state_folder.is_dir() and older_folder.is_dir()

    rest.delete_checkpoint_from_tinker_path(state).result()
    rest.delete_checkpoint(training.model_id, "sampler_weights/older").result()

    assert not state_folder.exists() and not older_folder.exists()
    remaining = paths(rest.list_checkpoints(training.model_id).result().checkpoints)
    assert state not in remaining and older not in remaining and len(remaining) == 1
    assert state not in paths(rest.list_user_checkpoints(limit=1000).result().checkpoints)
    with pytest.raises(tinker.NotFoundError, match="No saved state"):
        service.create_training_client_from_state(state).result()
    with pytest.raises(tinker.NotFoundError, match="no sampler weights named 'older'"):
        service.create_sampling_client(model_path=older).result()
    prompt = types.ModelInput.from_ints(TOKENS[:3])
    with pytest.raises(tinker.NotFoundError, match=f"The sampler weights {older} were deleted"):
        sampling_before.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint 'weights/doomed'"):
        rest.delete_checkpoint_from_tinker_path(state).result()


def test_publish_marks_a_checkpoint_public_and_twice_is_refused(
    service: tinker.ServiceClient, rest: tinker.RestClient
):
    training = trained_run(service)
    path = training.save_weights_for_sampler("shared").result().path

    def public() -> bool:
        listed = rest.list_checkpoints(training.model_id).result().checkpoints
        return next(c.public for c in listed if c.tinker_path == path)

    assert not public()
    rest.publish_checkpoint_from_tinker_path(path).result()
    assert public()
    with pytest.raises(tinker.BadRequestError, match="public already"):
        rest.publish_checkpoint_from_tinker_path(path).result()
    rest.unpublish_checkpoint_from_tinker_path(path).result()
    assert not public()
    with pytest.raises(tinker.BadRequestError, match="private already"):
        rest.unpublish_checkpoint_from_tinker_path(path).result()


def test_a_checkpoint_whose_ttl_ran_out_is_deleted(
    server: RunningServer, service: tinker.ServiceClient, rest: tinker.RestClient
):
    checkpoints = server.app.state.tinker_checkpoints
    training = trained_run(service)
    path = training.save_state("short-lived").result().path
    folder = checkpoints.states.saved[path].folder

    def expiry() -> datetime | None:
        listed = rest.list_checkpoints(training.model_id).result().checkpoints
        return next(c.expires_at for c in listed if c.tinker_path == path)

    with pytest.raises(tinker.BadRequestError, match="ttl_seconds 60 is out of range"):
        rest.set_checkpoint_ttl_from_tinker_path(path, 60).result()
    start = datetime.now(UTC)
    rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    assert start + timedelta(hours=2) <= expiry() <= datetime.now(UTC) + timedelta(hours=2)
    rest.set_checkpoint_ttl_from_tinker_path(path, None).result()
    assert expiry() is None
    rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result()

    real_clock = checkpoints.clock
    checkpoints.clock = lambda: real_clock() + timedelta(hours=1, seconds=1)  # an hour later
    try:
        assert path not in paths(rest.list_checkpoints(training.model_id).result().checkpoints)
    finally:
        checkpoints.clock = real_clock
    assert not folder.exists()
    with pytest.raises(tinker.NotFoundError, match="No saved state"):
        service.create_training_client_from_state(path).result()


def test_sessions_list_with_their_runs_samplers_and_metadata(
    service: tinker.ServiceClient, rest: tinker.RestClient
):
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    sampler = service.create_sampling_client(base_model="tiny").result()
    listed = rest.list_sessions(limit=100).result().sessions
    ours = [
        session_id
        for session_id in listed
        if rest.get_session(session_id).result().user_metadata == METADATA
    ]
    assert len(ours) == 1
    session = rest.get_session(ours[0]).result()
    assert training.model_id in session.training_run_ids
    assert sampler._sampling_session_id in session.sampler_ids
    assert rest.list_sessions(limit=1).result().sessions == listed[:1]
    with pytest.raises(tinker.NotFoundError, match="No session 'session-none'"):
        rest.get_session("session-none").result()


def test_a_ttl_given_at_save_time_is_the_checkpoints_expiry(
    service: tinker.ServiceClient, rest: tinker.RestClient
):
    training = trained_run(service)
    start = datetime.now(UTC)
    state = training.save_state("saved-with-ttl", ttl_seconds=7200).result().path
    sampler = training.save_weights_for_sampler("sampled-with-ttl", ttl_seconds=3600).result().path
    listed = {
        c.tinker_path: c.expires_at
        for c in rest.list_checkpoints(training.model_id).result().checkpoints
    }
    assert start + timedelta(hours=2) <= listed[state] <= datetime.now(UTC) + timedelta(hours=2)
    assert start + timedelta(hours=1) <= listed[sampler] <= datetime.now(UTC) + timedelta(hours=1)
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds 5 is out of range"):
        training.save_state("too-short", ttl_seconds=5).result()


@pytest.mark.parametrize(
    ("method", "route", "body", "named"),
    [
        ("POST", "weights_info", {}, "tinker_path"),
        ("POST", "weights_info", {"tinker_path": 5}, "tinker_path"),
        ("POST", "weights_info", {"tinker_path": "tinker://run/weights"}, "not a checkpoint path"),
        ("POST", "weights_info", {"tinker_path": "s3://run/weights/x"}, "not a checkpoint path"),
        ("POST", "weights_info", {"tinker_path": "tinker://nobody/weights/x"}, "No training run"),
        ("PUT", "training_runs/nobody/checkpoints/weights/x/ttl", {}, "ttl_seconds"),
        (
            "PUT",
            "training_runs/nobody/checkpoints/weights/x/ttl",
            {"ttl_seconds": "9"},
            "ttl_seconds",
        ),
        ("DELETE", "training_runs/nobody/checkpoints/weights/x", None, "No training run"),
        ("GET", "checkpoints?limit=0", None, "limit must be at least 1"),
        ("GET", "sessions?offset=-1", None, "offset at least 0"),
    ],
)
def test_bad_rest_input_is_a_4xx_naming_what_is_wrong(
    server: RunningServer, method: str, route: str, body: object, named: str
):
    answer = httpx.request(
        method, f"{server.url}/api/v1/{route}", json=body, headers={"X-API-Key": API_KEY}
    )
    assert 400 <= answer.status_code < 500, answer.text
    assert named in answer.json()["detail"]


def test_a_checkpoint_id_of_another_kind_is_refused_by_name(
    service: tinker.ServiceClient, server: RunningServer
):
    training = trained_run(service)
    for kind in ("external_weights", "other"):
        answer = httpx.delete(
            f"{server.url}/api/v1/training_runs/{training.model_id}/checkpoints/{kind}/x",
            headers={"X-API-Key": API_KEY},
        )
        assert answer.status_code == 400, answer.text
        assert "is not weights/<name> or sampler_weights/<name>" in answer.json()["detail"]
