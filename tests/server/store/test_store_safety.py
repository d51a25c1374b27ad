"""The store refuses to be led outside `--path`, never unpickles, and skips other base models."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import art_core as art
from art_backend.testing import ModelLoadError, TrainerStateError
from tests.support.servers import RunningServer, running_server, start_server

MODELS = "/v1/training/models"


class PlantedCode:
    """Unpickling this runs code: it creates the file `marker` (what an attacker would plant)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant_pickle(state_file: Path, marker: Path) -> None:
    """Replace a checkpoint's trainer state with a pickle that would run code when loaded."""
    import torch

    torch.save({"optimizer": PlantedCode(marker)}, state_file)


@pytest.fixture(scope="module")
def store_server(tiny_model_dir: Path, tmp_path_factory) -> Iterator[RunningServer]:
    """A server of its own: these tests plant files in its --path."""
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("store")) as running:
        yield running


def register(server: RunningServer, name: str, **extra) -> httpx.Response:
    body = {"project": "safe", "name": name, "base_model": "tiny", **extra}
    return httpx.post(f"{server.url}{MODELS}", json=body, timeout=60)


@pytest.fixture(scope="module")
def source(store_server: RunningServer) -> Path:
    """A registered model (step 0 on disk) to fork from."""
    assert register(store_server, "source").status_code == 200
    return store_server.art_path / "safe/models/source"


def assert_healthy(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert register(server, "source").status_code == 200  # already registered: answered again


def assert_fork_refused(
    server: RunningServer, response: httpx.Response, name: str, param: str
) -> str:
    """The fork was a 400 naming `param`, nothing was written for model `name`, the server is
    healthy; returns the error's message."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert not (server.art_path / "safe/models" / name).exists()
    assert_healthy(server)
    return error["message"]


@pytest.mark.parametrize(
    ("fork_from", "param"),
    [
        ({"project": "../../outside", "name": "m"}, "fork_from.project"),
        ({"project": "safe", "name": "../source"}, "fork_from.name"),
        ({"project": "/tmp", "name": "m"}, "fork_from.project"),
        ({"project": "safe", "name": "/etc/passwd"}, "fork_from.name"),
        ({"project": "..", "name": "source"}, "fork_from.project"),
    ],
    ids=["dotdot-project", "dotdot-name", "absolute-project", "absolute-name", "bare-dotdot"],
)
def test_fork_from_names_that_leave_the_store_are_400(
    store_server: RunningServer, source: Path, fork_from: dict, param: str
):
    response = register(store_server, "fork-bad-name", fork_from=fork_from)

    message = assert_fork_refused(store_server, response, "fork-bad-name", param)
    assert "letters, digits" in message


def test_fork_from_a_model_folder_that_links_outside_is_400_and_copies_nothing(
    store_server: RunningServer, source: Path, tmp_path: Path
):
    # Outside --path: a complete-looking checkpoint whose trainer state runs code when unpickled.
    outside = tmp_path / "outside-model"
    shutil.copytree(source, outside)
    marker = tmp_path / "code-ran"
    plant_pickle(outside / "checkpoints/0000/trainer_state.pt", marker)
    (store_server.art_path / "linked/models").mkdir(parents=True)
    (store_server.art_path / "linked/models/m").symlink_to(outside)

    response = register(store_server, "fork-link", fork_from={"project": "linked", "name": "m"})

    message = assert_fork_refused(store_server, response, "fork-link", "fork_from")
    assert "outside the server's --path" in message
    assert not marker.exists()


def test_fork_from_a_checkpoint_holding_a_link_is_400_and_copies_nothing(
    store_server: RunningServer, source: Path, tmp_path: Path
):
    planted = store_server.art_path / "safe/models/planted"
    shutil.copytree(source, planted)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (planted / "checkpoints/0000/notes.txt").symlink_to(secret)

    response = register(
        store_server, "fork-file-link", fork_from={"project": "safe", "name": "planted"}
    )

    message = assert_fork_refused(store_server, response, "fork-file-link", "fork_from")
    assert "symbolic link (notes.txt)" in message


def test_a_planted_pickle_in_a_fork_source_is_never_run(
    store_server: RunningServer, source: Path, tmp_path: Path
):
    tampered = store_server.art_path / "safe/models/tampered"
    shutil.copytree(source, tampered)
    marker = tmp_path / "code-ran"
    plant_pickle(tampered / "checkpoints/0000/trainer_state.pt", marker)

    response = register(
        store_server, "fork-pickle", fork_from={"project": "safe", "name": "tampered"}
    )

    message = assert_fork_refused(store_server, response, "fork-pickle", "fork_from")
    assert "unsupported GLOBAL" in message and "delete the file" in message
    assert "weights_only=False" not in message  # never advise reopening the hole
    assert not marker.exists()


def test_a_planted_pickle_in_a_models_own_checkpoint_is_never_run(
    store_server: RunningServer, source: Path, tmp_path: Path
):
    # The model's own folder, tampered with before this server registered it.
    own = store_server.art_path / "safe/models/own"
    shutil.copytree(source, own)
    marker = tmp_path / "code-ran"
    plant_pickle(own / "checkpoints/0000/trainer_state.pt", marker)

    response = register(store_server, "own")

    assert response.status_code == 409, response.text
    message = response.json()["error"]["message"]
    assert "trainer_state.pt cannot be used" in message and "delete the file" in message
    assert not marker.exists()
    assert_healthy(store_server)

    # What the message says to do works: without the state, the adapter resumes.
    (own / "checkpoints/0000/trainer_state.pt").unlink()
    response = register(store_server, "own")
    assert response.status_code == 200 and response.json()["resumed"] is True


def test_a_model_trained_on_another_base_model_is_400_naming_it(store_server: RunningServer):
    other = store_server.art_path / "safe/models/other-base"
    other.mkdir(parents=True)
    (other / "model.json").write_text(json.dumps({"base_model": "someone/else", "lora": {}}))

    response = register(store_server, "other-base")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "base_model" and "'someone/else'" in error["message"]


def test_the_trainer_state_is_saved_without_pickled_objects(source: Path):
    import torch

    state = torch.load(source / "checkpoints/0000/trainer_state.pt", weights_only=True)
    assert set(state) == {"optimizer", "optimizer_steps", "rng"}


def test_a_trainer_state_written_with_the_old_scheduler_entry_still_reads(
    source: Path, tmp_path: Path
):
    import torch

    from art_backend.training._trainer_state import read_trainer_state

    state = torch.load(source / "checkpoints/0000/trainer_state.pt", weights_only=True)
    # What a LambdaLR's state_dict held before the no-op scheduler went.
    state["scheduler"] = {"base_lrs": [1e-5], "last_epoch": 3, "lr_lambdas": [None]}
    torch.save(state, tmp_path / "trainer_state.pt")
    assert (
        read_trainer_state(tmp_path / "trainer_state.pt")["optimizer_steps"]
        == (state["optimizer_steps"])
    )
    state["scheduler"] = "not a state"
    torch.save(state, tmp_path / "trainer_state.pt")
    with pytest.raises(TrainerStateError, match="unexpected contents"):
        read_trainer_state(tmp_path / "trainer_state.pt")


# ------------------------------------------------------------------ another base model at start


def reshape_as_another_base_model(checkpoint: Path) -> None:
    """Make a checkpoint's LoRA weights fit a wider model (hidden size +32), like SmolLM2's do."""
    from safetensors.torch import load_file, save_file

    weights = load_file(checkpoint / "adapter_model.safetensors")
    wider = {}
    for key, tensor in weights.items():
        rows, columns = tensor.shape
        wider[key] = tensor.new_zeros(
            (rows, columns + 32) if "lora_A" in key else (rows + 32, columns)
        )
    save_file(wider, checkpoint / "adapter_model.safetensors")


@pytest.fixture
def art_with_a_trained_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A --path with `p/good` (tiny model, step 0) written by a real server that then stopped."""
    with running_server(tiny_model_dir, tmp_path / "art") as running:
        body = {"project": "p", "name": "good", "base_model": "tiny"}
        assert httpx.post(f"{running.url}{MODELS}", json=body, timeout=60).status_code == 200
    return tmp_path / "art"


def test_checkpoints_of_another_base_model_are_skipped_at_start(
    tiny_model_dir: Path, art_with_a_trained_model: Path, caplog: pytest.LogCaptureFixture
):
    art_path = art_with_a_trained_model
    other = art_path / "p/models/smol"
    shutil.copytree(art_path / "p/models/good", other)
    reshape_as_another_base_model(other / "checkpoints/0000")
    (other / "model.json").write_text(
        json.dumps({"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "lora": {}})
    )

    with running_server(tiny_model_dir, art_path) as running:
        adapters = running.service.engine.adapters
        assert "good@0" in adapters and "smol@0" not in adapters
        assert "p/smol: trained on base model 'HuggingFaceTB/SmolLM2-135M-Instruct'" in caplog.text
        assert "1 model(s) under" in caplog.text
        models = httpx.get(f"{running.url}/v1/models").json()["data"]
        assert "good@0" in {m["id"] for m in models}


def unrecorded_misfit(art_path: Path) -> Path:
    """A model with no model.json whose adapters claim this base model but do not fit it."""
    misfit = art_path / "p/models/misfit"
    shutil.copytree(art_path / "p/models/good", misfit)
    (misfit / "model.json").unlink()
    reshape_as_another_base_model(misfit / "checkpoints/0000")
    return misfit


def test_a_checkpoint_that_still_fails_to_load_names_itself_and_the_cause(
    tiny_model_dir: Path, art_with_a_trained_model: Path
):
    misfit = unrecorded_misfit(art_with_a_trained_model)

    with pytest.raises(ModelLoadError) as raised:
        start_server(tiny_model_dir, art_with_a_trained_model)

    message = raised.value.message
    assert str(misfit / "checkpoints/0000") in message and "does not fit this model" in message
    assert "move its model folder out of" in message


async def test_local_backend_names_the_cause_instead_of_advising_a_restart(
    tiny_model_dir: Path, art_with_a_trained_model: Path
):
    unrecorded_misfit(art_with_a_trained_model)
    backend = art.LocalBackend(path=art_with_a_trained_model, dtype="float32")
    model = art.TrainableModel(name="good", project="p", base_model=str(tiny_model_dir))
    try:
        with pytest.raises(art.BackendCrashedError) as raised:
            await model.register(backend)
    finally:
        await backend.close()

    message = str(raised.value)
    assert message.splitlines()[0].startswith("The backend process exited while starting")
    assert "misfit/checkpoints/0000 does not load onto base model" in message.splitlines()[0]
    assert "start a new LocalBackend" not in message


def test_the_planted_pickle_does_run_code_when_unpickled_unsafely(tmp_path: Path):
    # The control of the tests above: the payload is live, so "not run" means "refused".
    import torch

    marker = tmp_path / "code-ran"
    plant_pickle(tmp_path / "state.pt", marker)
    torch.load(tmp_path / "state.pt", weights_only=False)
    assert marker.exists()


def test_a_failed_first_register_leaves_the_server_serving_and_writes_no_model_json(
    tiny_model_dir: Path, art_with_a_trained_model: Path, tmp_path: Path
):
    """The misfit is registered on a running server that holds no adapter yet: the trainer's
    adapter was the model's only one, and deleting it used to leave PEFT broken (500s)."""
    with running_server(tiny_model_dir, tmp_path / "fresh") as running:
        misfit = unrecorded_misfit(art_with_a_trained_model)
        shutil.copytree(misfit, running.art_path / "safe/models/misfit")

        refused = register(running, "misfit")

        assert refused.status_code == 409, refused.text
        assert "size mismatch" in refused.json()["error"]["message"]
        assert not (running.art_path / "safe/models/misfit/model.json").exists()
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx.post(f"{running.url}/v1/chat/completions", json=chat, timeout=60)
        assert answer.status_code == 200, answer.text
        assert register(running, "next").status_code == 200
        served = httpx.post(f"{running.url}/v1/chat/completions", json={**chat, "model": "next"})
        assert served.status_code == 200, served.text
