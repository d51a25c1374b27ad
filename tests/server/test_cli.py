"""`art-server` as a user runs it: a real process, key from the environment, SIGTERM drains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import art_server_refusal
from tests.support.servers import free_port


@pytest.fixture
def server_process(tiny_model_dir: Path, tmp_path: Path):
    port = free_port()
    env = {**os.environ, "ART_API_KEY": "from-env", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "art_backend.cli",
            "--model",
            str(tiny_model_dir),
            "--name",
            "tiny",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--path",
            str(tmp_path),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"art-server exited early:\n{process.stdout.read()}")
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("art-server did not become healthy")
        time.sleep(0.2)
    yield process, url
    if process.poll() is None:
        process.kill()
        process.wait(10)


def test_key_from_environment_is_required(server_process):
    _, url = server_process
    assert httpx.get(f"{url}/v1/models").status_code == 401
    models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer from-env"}).json()
    assert next(m["id"] for m in models["data"]) == "tiny"


def test_sigterm_drains_in_flight_requests_then_exits(server_process):
    process, url = server_process
    payload = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "a long answer please"}],
        "max_tokens": 200,
        "stream": True,
    }
    headers = {"Authorization": "Bearer from-env"}
    finish_reasons, done = [], False
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=payload, headers=headers, timeout=60
    ) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: {") and '"token_ids"' in line:
                process.send_signal(signal.SIGTERM)  # the request is mid-generation
                break
        for line in lines:
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                if choice.get("finish_reason"):
                    finish_reasons.append(choice["finish_reason"])
    assert done and finish_reasons in (["length"], ["stop"])
    # uvicorn re-raises SIGTERM after its graceful shutdown: exit by that signal, not a crash.
    assert process.wait(60) in (0, -signal.SIGTERM)
    assert "Traceback" not in process.stdout.read()


def test_bad_model_path_exits_with_a_clear_message(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "art_backend.cli", "--model", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode != 0
    assert "smollm2-135m-instruct" in result.stderr


def test_a_backend_started_with_exit_with_parent_stops_when_its_parent_is_killed(
    tiny_model_dir: Path, tmp_path: Path
):
    """A LocalBackend's child must not outlive a parent killed without cleanup (SIGKILL)."""
    port = free_port()
    parent_script = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "art_backend.cli", "--model", {str(tiny_model_dir)!r},
    "--port", "{port}", "--dtype", "float32", "--path", {str(tmp_path)!r},
    "--exit-with-parent", str(os.getpid())])
print(child.pid, flush=True)
time.sleep(3600)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_script], stdout=subprocess.PIPE, text=True
    )
    child_pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return  # gone (reaped by init once the parent died)
        # A zombie child of init counts as stopped.
        status = Path(f"/proc/{child_pid}/status")
        if status.exists() and "zombie" in status.read_text():
            return
        time.sleep(0.2)
    os.kill(child_pid, signal.SIGKILL)
    pytest.fail("the backend outlived its killed parent")


def test_startup_discovery_serves_a_name_for_one_project_only(tmp_path: Path):
    from art_backend.cli import discover_checkpoints

    for project in ("alpha", "beta"):
        step_dir = tmp_path / project / "models" / "agent" / "checkpoints" / "0001"
        step_dir.mkdir(parents=True)
        (step_dir / "adapter_config.json").write_text("{}")
    found, skipped = discover_checkpoints(tmp_path)
    assert [name for name, _ in found] == ["agent@1"]
    assert found[0][1].parts[-5] == "alpha"
    assert len(skipped) == 1 and skipped[0].startswith("beta/agent: the name is already served")


def test_an_unknown_log_level_is_refused_naming_the_choices():
    refusal = art_server_refusal("--model", "/no/such/model", "--log-level", "loud", timeout=60)
    assert "--log-level: invalid choice: 'loud'" in refusal and "trace" in refusal


def test_every_flag_has_a_row_on_the_serving_page_and_the_model_row_names_what_it_takes():
    """docs/serving.md's option tables list every `art-server` flag, and its `--model` row says
    what `--model` takes, a GGUF file or a folder holding one included (the help says so)."""
    from art_backend.cli import _parser

    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `--")]
    flags = {
        flag
        for action in _parser()._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }
    missing = sorted(flag for flag in flags if not any(f"`{flag}`" in row for row in rows))
    assert not missing, f"flags without a row in docs/serving.md: {missing}"
    (model_row,) = [row for row in rows if row.startswith("| `--model` |")]
    for kind in ("GGUF file", "a folder holding", "hub id", "smollm2-135m-instruct"):
        assert kind.lower() in model_row.lower(), kind
