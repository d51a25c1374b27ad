"""A start is never a silent wait: the server names each phase of its start on stderr
(`art-server: <phase>`), and `LocalBackend`, whose server writes to a log file, shows those
lines in the user's terminal with the seconds since the start. What the server warns of while
it starts reaches that user too, as a `BackendWarning` (issue 49: a base model's missing chat
template was said only in backend.log; the user learnt of it from a 400 at the first rollout)."""

from __future__ import annotations

import socket
import warnings
from pathlib import Path

import pytest

import art_core as art
from art_backend.engines._loading import _build_cache
from art_core.errors import BackendWarning
from art_core.local import backend as local_backend
from art_core.local.backend import _PhaseLines
from tests.support.tiny_model import build_tiny_model


def test_phase_lines_are_read_as_they_come_and_errors_are_left_to_the_crash_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    log = tmp_path / "backend.log"
    log.write_bytes(b"an earlier run's line\nart-server: loading the model old\n")
    phases = _PhaseLines(log, log.stat().st_size)
    with log.open("ab") as out:
        out.write(b"Loading weights: 50%\rLoading weights: 100%\nart-server: loading the mo")
    phases.show(0.0)
    assert capsys.readouterr().err == ""  # an earlier run's line, progress bars, a half line
    with log.open("ab") as out:
        out.write(b"del tiny\nart-server: error: no such model\n")
    phases.show(0.0)
    shown = capsys.readouterr().err.splitlines()
    assert len(shown) == 1 and shown[0].startswith("  loading the model tiny (")


def test_the_warnings_a_server_logs_while_it_starts_are_raised_as_backend_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    log = tmp_path / "backend.log"
    log.write_bytes(b"WARNING art_backend.cli: an earlier run's warning\n")
    phases = _PhaseLines(log, log.stat().st_size)
    log.write_bytes(
        log.read_bytes()
        + b"INFO art_backend.loading: dtype auto -> float32\n"
        + b"Loading weights: 100%\rWARNING art_backend.cli: This model's tokenizer has no chat "
        + b"template (a base model).\n"
        + b"ERROR art_backend.engines: a replica failed its probe\n"
        + b"WARNING:  uvicorn's own format\n"
        + b"/site-packages/peft/x.py:12: FutureWarning: `foo` is deprecated\n"
        + b"  warnings.warn(\n"
        + b"art-server: starting the torch engine\n"
        + b"WARNING art_backend.cli: half a li"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        phases.show(0.0)
    assert [str(warning.message) for warning in caught] == [
        "art-server: This model's tokenizer has no chat template (a base model).",
        "art-server: a replica failed its probe",
        "art-server: uvicorn's own format",
        "art-server: FutureWarning: `foo` is deprecated",
    ]
    assert {warning.category for warning in caught} == {BackendWarning}
    assert caught[0].filename == str(log)  # the warning names the log the rest is in
    assert capsys.readouterr().err.splitlines()[0].startswith("  starting the torch engine (")


def test_a_first_conversion_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    def build(folder: Path) -> None:
        (folder / "config.json").write_text("{}")

    target = tmp_path / "models" / "tiny"
    _build_cache(target, build)
    assert f"art-server: converting the model into {target}" in capsys.readouterr().err
    _build_cache(target, build)  # converted: nothing to say
    assert "converting" not in capsys.readouterr().err


async def test_local_backend_shows_the_servers_start_phases_and_warns_with_its_warnings(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    # The port probed free is taken by another process before the child binds it (a race seen
    # in CI): the child exits on "address already in use" and the backend starts on another.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    ports = iter([taken_port])
    probe = local_backend._free_port
    monkeypatch.setattr(local_backend, "_free_port", lambda: next(ports, None) or probe())
    base_model = build_tiny_model(tmp_path / "base-model", chat_template=False)
    backend = art.LocalBackend(path=tmp_path / "art", dtype="float32")
    try:
        model = art.TrainableModel(name="phases", project="tests", base_model=str(base_model))
        with pytest.warns(BackendWarning, match="tokenizer has no chat template") as warned:
            await model.register(backend)
    finally:
        await backend.close()
        taken.close()
    assert "--chat-template" in str(warned[0].message)  # what to do about it, too
    assert not [w for w in warned if "already in use" in str(w.message)]  # handled, not warned
    assert backend.base_url != f"http://127.0.0.1:{taken_port}"
    shown = capfd.readouterr().err
    assert "  starting (importing torch and transformers) (" in shown
    assert f"  loading the model {base_model} (" in shown
    assert "  starting the torch engine (torch.float32 on cpu) (" in shown
    assert "  backend ready (" in shown
    assert "  the port was taken while the backend started; starting it on another" in shown
