"""A start is never a silent wait: the server names each phase of its start on stderr
(`art-server: <phase>`), and `LocalBackend`, whose server writes to a log file, shows those
lines in the user's terminal with the seconds since the start."""

from __future__ import annotations

from pathlib import Path

import pytest

import art_core as art
from art_backend.engines._loading import _build_cache
from art_core.local.backend import _PhaseLines


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


def test_a_first_conversion_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    def build(folder: Path) -> None:
        (folder / "config.json").write_text("{}")

    target = tmp_path / "models" / "tiny"
    _build_cache(target, build)
    assert f"art-server: converting the model into {target}" in capsys.readouterr().err
    _build_cache(target, build)  # converted: nothing to say
    assert "converting" not in capsys.readouterr().err


async def test_local_backend_shows_the_servers_start_phases(
    tiny_model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
):
    backend = art.LocalBackend(path=tmp_path, dtype="float32")
    try:
        model = art.TrainableModel(name="phases", project="tests", base_model=str(tiny_model_dir))
        await model.register(backend)
    finally:
        await backend.close()
    shown = capfd.readouterr().err
    assert "  starting (importing torch and transformers) (" in shown
    assert f"  loading the model {tiny_model_dir} (" in shown
    assert "  starting the torch engine (torch.float32 on cpu) (" in shown
    assert "  backend ready (" in shown
