"""The Tinker API's settings check themselves, with the types and bounds of the OpenAI routes.

Each test is a row of issue 50's table, through the real `tinker` SDK where it sends the value
and raw HTTP where it cannot (it turns `"4"` and `true` into ints before sending): an infinite
AdamW setting, a seed past 64 bits, stop strings past the shared bound, a LoRA rank past the
model's width or of the wrong type, and a token id sent as `true` are 400s naming the field; the
404 of an unknown run names only what was asked for; and a server killed in `create_model`
leaves no temporary folder behind once the next one starts on its folder.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

from art_backend.engines._engine import MAX_STOP_CHARACTERS  # noqa: E402
from tests.server.tinker.test_tinker_restart import API_KEY as KILLED_KEY  # noqa: E402
from tests.server.tinker.test_tinker_restart import art_server, kill_at  # noqa: E402
from tests.support.servers import RunningServer, running_tinker_server  # noqa: E402

API_KEY = "tml-settings-key"
PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]}


@pytest.fixture(scope="module")
def killed_in_create_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of an art-server SIGKILLed in `create_model`, before its first checkpoint's
    rename: it holds the checkpoint's temporary folder."""
    path = tmp_path_factory.mktemp("art-killed")
    log = path.parent / f"{path.name}.log"
    with art_server(tiny_model_dir, path, log, "before_rename") as killed:
        headers = {"X-API-Key": KILLED_KEY}
        session = httpx.post(f"{killed['url']}/api/v1/create_session", json={}, headers=headers)
        body = {"session_id": session.json()["session_id"], "base_model": "tiny"}
        body["lora_config"] = {"rank": 4}
        httpx.post(f"{killed['url']}/api/v1/create_model", json=body, headers=headers)
        kill_at(killed, log, "before_rename")
    assert list(path.glob("tinker/models/*/checkpoints/.tmp-0000-*")), "no temporary to remove"
    return path


@pytest.fixture(scope="module")
def server(killed_in_create_model: Path, tiny_model_dir: Path) -> Iterator[RunningServer]:
    """The module's one server, started on the killed server's folder."""
    with running_tinker_server(tiny_model_dir, killed_in_create_model, api_key=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def service(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield client
    client.close("success")


def post(server: RunningServer, route: str, body: dict) -> httpx.Response:
    """POST `body` to /api/v1/`route` as Python writes JSON (`Infinity` included)."""
    headers = {"X-API-Key": API_KEY, "Content-Type": "application/json"}
    url = f"{server.url}/api/v1/{route}"
    return httpx.post(url, content=json.dumps(body), headers=headers, timeout=60)


def outcome(server: RunningServer, request_id: str) -> dict:
    """The answer of the operation `request_id` names, once it is done."""
    deadline = time.monotonic() + 120
    while True:
        answer = post(server, "retrieve_future", {"request_id": request_id}).json()
        if answer.get("type") != "try_again":
            return answer
        assert time.monotonic() < deadline, "the operation was held"
        time.sleep(0.1)


def test_a_server_killed_in_create_model_leaves_no_temporary_folder_after_a_restart(
    server: RunningServer,
):
    assert list(server.art_path.glob("tinker/models/*/checkpoints/.tmp-*")) == []


def test_an_infinite_adam_setting_is_refused_and_the_run_trains_on(
    service: tinker.ServiceClient, server: RunningServer
):
    # Raw JSON: Python's reader takes `Infinity`; the SDK itself would send null.
    model_id = service.create_lora_training_client(base_model="tiny", rank=4).result().model_id
    for seq_id, field in enumerate(("learning_rate", "eps", "weight_decay"), start=1):
        body = {"model_id": model_id, "seq_id": seq_id, "adam_params": {field: math.inf}}
        answer = post(server, "optim_step", body)
        assert answer.status_code == 400
        assert answer.json()["detail"] == (
            f"Invalid value for `adam_params.{field}`: Input should be a finite number"
        )
    # The refused steps took their turns: the run's next operation is not held behind them.
    body = {"model_id": model_id, "seq_id": 4, "adam_params": {"learning_rate": 1e-4}}
    started = post(server, "optim_step", body).json()["request_id"]
    assert math.isfinite(outcome(server, started)["metrics"]["grad_norm"])


def test_a_seed_past_64_bits_is_refused_by_name(service: tinker.ServiceClient):
    sampler = service.create_sampling_client(base_model="tiny").result()
    params = types.SamplingParams(max_tokens=2, seed=2**70)
    prompt = types.ModelInput.from_ints([5, 6, 7])
    with pytest.raises(
        tinker.BadRequestError, match=r"`sampling_params\.seed`: .*less than or equal"
    ):
        sampler.sample(prompt, 1, params).result()


def test_stop_strings_meet_the_bound_of_every_route(server: RunningServer):
    body = {"base_model": "tiny", "prompt": PROMPT, "num_samples": 1}
    at_bound = ["x" * (MAX_STOP_CHARACTERS // 2)] * 2
    answer = post(
        server, "asample", {**body, "sampling_params": {"max_tokens": 1, "stop": at_bound}}
    )
    assert answer.status_code == 200, answer.text
    past = ["x" * 100] * 200  # 20,000 characters
    answer = post(server, "asample", {**body, "sampling_params": {"max_tokens": 1, "stop": past}})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("Invalid value for `sampling_params.stop`: ")
    assert f"{MAX_STOP_CHARACTERS:,} characters in all" in answer.json()["detail"]


def test_a_lora_rank_past_the_models_width_is_refused_naming_both(
    server: RunningServer, tiny_model_dir: Path
):
    width = json.loads((tiny_model_dir / "config.json").read_text())["hidden_size"]
    body = {"session_id": "session-x", "base_model": "tiny", "lora_config": {"rank": 1024}}
    answer = post(server, "create_model", body)
    assert answer.status_code == 400
    assert (
        f"LoRA rank 1024 exceeds the width of the base model (hidden size {width})"
        in (answer.json()["detail"])
    )


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("create_model", {"base_model": "tiny", "lora_config": {"rank": "4"}}, "lora_config.rank"),
        ("create_model", {"base_model": "tiny", "lora_config": {"rank": True}}, "lora_config.rank"),
        (
            "create_model",
            {"base_model": "tiny", "lora_config": {"rank": 4, "train_mlp": "yes"}},
            "lora_config.train_mlp",
        ),
        (
            "asample",
            {
                "base_model": "tiny",
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, True]}]},
                "sampling_params": {"max_tokens": 1},
            },
            "prompt.chunks[0].tokens[1]",
        ),
        (
            "asample",
            {"base_model": "tiny", "prompt": PROMPT, "sampling_params": {"max_tokens": "2"}},
            "sampling_params.max_tokens",
        ),
    ],
)
def test_ints_and_flags_take_their_own_json_types_as_on_the_openai_routes(
    server: RunningServer, route: str, body: dict, field: str
):
    answer = post(server, route, {"session_id": "session-x", **body})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith(
        f"Invalid value for `{field}`: Input should be a valid"
    )


def test_an_unknown_run_is_named_alone_in_its_404(
    service: tinker.ServiceClient, server: RunningServer
):
    other = service.create_lora_training_client(base_model="tiny", rank=4).result().model_id
    answer = post(server, "get_info", {"model_id": "tinker-unknown"})
    assert answer.status_code == 404
    assert "'tinker-unknown'" in answer.json()["detail"]
    assert other not in answer.json()["detail"]
