"""The Tinker API across a restart and a SIGKILL: what was saved whole comes back, nothing half.

A real `art-server` process trains a run through the SDK and saves a state and sampler weights;
a second one is killed in the middle of an `optim_step` (and a third in the middle of writing a
state); the server started after them on the same folder trains on from the saved state (the
adapter and Adam's moments: the next step lands where it landed the first time), samples the
old sampler path, and lists the old run's checkpoints, with no temporary folder left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

from art_backend.tinker._states import found_states  # noqa: E402
from tests.support.processes import stop_process, wait_until_listening  # noqa: E402
from tests.support.servers import free_port  # noqa: E402

API_KEY = "tml-restart-key"
ADAM = types.AdamParams(learning_rate=0.5, beta1=0.9, beta2=0.99, eps=1.0)
TOKENS = list(range(10, 30))
DATUM = types.Datum(
    model_input=types.ModelInput.from_ints(TOKENS[:-1]),
    loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0 / 19] * 19},
)


@contextmanager
def art_server(model: Path, path: Path, log: Path, fault: str | None = None) -> Iterator[dict]:
    """`art-server` in a child process on `path`; yields its process and an SDK client."""
    port = free_port()
    env = {**os.environ, "TINKER_TELEMETRY": "0"}
    env.pop("ART_FAULT_PAUSE", None)
    if fault is not None:
        env["ART_FAULT_PAUSE"] = f"{fault}:120"
    command = [sys.executable, "-m", "art_backend.cli", "--model", str(model), "--name", "tiny"]
    command += ["--port", str(port), "--path", str(path), "--dtype", "float32"]
    command += ["--api-key", API_KEY]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    service = None
    try:
        wait_until_listening(process, port, log)
        service = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key=API_KEY)
        yield {"process": process, "service": service, "url": f"http://127.0.0.1:{port}"}
    finally:
        if service is not None:
            service.close("success")
        stop_process(process)


def kill_at(server: dict, log: Path, fault: str) -> None:
    """SIGKILL the server once its log says it reached the fault point."""
    for _ in range(2400):
        if f"fault point {fault} reached" in log.read_text(errors="replace"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the server never reached {fault}:\n{log.read_text()}")
    os.kill(server["process"].pid, signal.SIGKILL)
    server["process"].wait(30)


def step(training: tinker.TrainingClient) -> list[float]:
    """One cross_entropy step, then the datum's logprobs after it."""
    training.forward_backward([DATUM], "cross_entropy").result()
    training.optim_step(ADAM).result()
    return (
        training.forward([DATUM], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    )


def test_a_killed_server_restarts_from_its_last_saved_state(tiny_model_dir: Path, tmp_path: Path):
    path = tmp_path / "art"
    logs = tmp_path / "logs"
    logs.mkdir()
    with art_server(tiny_model_dir, path, logs / "first.log") as first:
        training = first["service"].create_lora_training_client(base_model="tiny", rank=4).result()
        model_id = training.model_id
        step(training)
        state = training.save_state("after-one").result().path
        sampler = training.save_weights_for_sampler("one").result().path
        second_step = step(training)  # from the saved state, the next step lands here

    with art_server(tiny_model_dir, path, logs / "killed.log", "tinker_after_optim_step") as s:
        resumed = s["service"].create_training_client_from_state_with_optimizer(state).result()
        resumed.forward_backward([DATUM], "cross_entropy").result()
        resumed.optim_step(ADAM)  # never answered: killed with its update in memory only
        kill_at(s, logs / "killed.log", "tinker_after_optim_step")

    with art_server(tiny_model_dir, path, logs / "killed2.log", "tinker_before_state_rename") as s:
        resumed = s["service"].create_training_client_from_state(state).result()
        resumed.save_state("half-written")  # killed between writing it and renaming it
        kill_at(s, logs / "killed2.log", "tinker_before_state_rename")
    assert list((path / "tinker" / "states").glob("*/.tmp-*")), "the kill left its temporary"

    with art_server(tiny_model_dir, path, logs / "last.log") as last:
        service = last["service"]
        resumed = service.create_training_client_from_state_with_optimizer(state).result()
        again = step(resumed)
        assert max(abs(a - b) for a, b in zip(again, second_step, strict=True)) < 1e-5
        # The old run samples from its sampler path and lists what it saved, whole.
        sampling = service.create_sampling_client(model_path=sampler).result()
        prompt = types.ModelInput.from_ints(TOKENS[:5])
        sampled = sampling.sample(prompt, 1, types.SamplingParams(max_tokens=3)).result()
        assert len(sampled.sequences[0].tokens) == 3
        rest = tinker.RestClient(base_url=last["url"], api_key=API_KEY)
        listed = rest.list_checkpoints(model_id).result().checkpoints
        assert sorted(c.tinker_path for c in listed) == sorted([sampler, state])
        assert {c.checkpoint_type for c in listed} == {"training", "sampler"}
        run = rest.get_training_run(model_id).result()
        assert (run.base_model, run.lora_rank) == ("tiny", 4)
        assert run.last_sampler_checkpoint.tinker_path == sampler
        # The old run does not train on (its optimizer ended with its process): a clear 400,
        # as an SDK client that lived through the restart would get for its next step.
        answer = httpx.post(
            f"{last['url']}/api/v1/optim_step",
            headers={"X-API-Key": API_KEY},
            json={"model_id": model_id, "seq_id": 9, "adam_params": ADAM.model_dump()},
        )
        assert answer.status_code == 400, answer.text
        assert "before this server restarted" in answer.json()["detail"]
    assert not list((path / "tinker" / "states").glob("*/.tmp-*"))
    assert "half-written" not in json.dumps(
        [str(p) for p in (path / "tinker" / "states").rglob("*")]
    )


def test_an_overwrite_cut_between_its_renames_gets_its_older_state_back(tmp_path: Path):
    run = tmp_path / "tinker-abc"
    (run / ".old-mine-123").mkdir(parents=True)
    record = {"base_model": "tiny", "lora": {"r": 4}, "path": "tinker://x/weights/mine"}
    (run / ".old-mine-123" / "tinker_state.json").write_text(json.dumps(record))
    (run / ".tmp-other-123").mkdir()
    (run / "broken").mkdir()
    (run / "broken" / "tinker_state.json").write_text("{not json")
    saved = found_states(tmp_path)
    assert list(saved) == ["tinker://x/weights/mine"]
    assert saved["tinker://x/weights/mine"].folder == run / "mine"
    assert sorted(item.name for item in run.iterdir()) == ["broken", "mine"]
