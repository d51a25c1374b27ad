"""Replayable runs: every step is recorded in the manifest, and `art replay` trains it again.

The server runs in a child process (`LocalBackend`) with a fixed thread count, so that no other
test server in this process moves torch's thread count under it; `art replay` runs as its own
process too, as a user runs it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_core.utils import scenario_hash
from tests.support.rollouts import groups_for, varied_group

QUESTIONS = ["What is 1 + 1?", "What is 2 + 3?"]
NAME = "replayed"
# As a rollout sets them (RULER sets judge_cache_key itself: tests/core/test_ruler.py).
CLIENT_HASHES = {
    "scenario_sha256": scenario_hash({"question": QUESTIONS[0]}),
    "judge_cache_key": "cd" * 32,
}


def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`art replay` (its entry point's module) in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "art_backend.training.replay_cli", "--path", str(path), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
async def trained_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three GRPO steps of one model on a server with 2 fixed threads; its --path."""
    path = tmp_path_factory.mktemp("art-replay")
    backend = art.LocalBackend(path=path, dtype="float32", extra_args=["--threads", "2"])
    try:
        model = art.TrainableModel(name=NAME, project="p", base_model=str(tiny_model_dir))
        await model.register(backend)
        for _ in range(3):
            groups = varied_group(await groups_for(model, QUESTIONS))
            for trajectory in groups[0].trajectories:
                trajectory.metadata.update(CLIENT_HASHES)
            await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    finally:
        await backend.close()
    return path


def copy_of(run: Path, tmp_path: Path) -> Path:
    """A copy of the run's folder, to damage without touching the run."""
    copy = tmp_path / "art"
    shutil.copytree(run, copy)
    return copy


def model_dir(path: Path) -> Path:
    return path / "p" / "models" / NAME


def test_the_manifest_holds_code_packages_base_model_settings_seeds_and_every_step(
    trained_run: Path,
):
    from art_backend.training._replay_record import adapter_sha256

    manifest = json.loads((model_dir(trained_run) / "manifest.json").read_text())
    model = manifest["model"]
    assert model["seed"] == 0 and model["lora"]["r"] > 0
    files = model["base_model_files"]
    assert len(files["sha256"]) == 64
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(files["files"])
    environment = manifest["environments"][manifest["current_environment"]]
    assert environment["code"]["art_trainer"] and "git_commit" in environment["code"]
    assert {"torch", "transformers", "peft"} <= {k for k, v in environment["packages"].items() if v}
    assert (environment["device"], environment["dtype"], environment["threads"]) == (
        "cpu", "float32", 2,
    )  # fmt: skip
    assert sorted(manifest["steps"]) == ["1", "2", "3"]
    for step in (1, 2, 3):
        checkpoint = model_dir(trained_run) / f"checkpoints/{step:04d}"
        summary = manifest["steps"][str(step)]
        record = json.loads((checkpoint / "replay.json").read_text())
        assert summary["adapter_sha256"] == adapter_sha256(checkpoint / "adapter_model.safetensors")
        assert summary["inputs_sha256"] == record["inputs"]["sha256"]
        assert record["threads"] == 2 and record["threads_changed_during_step"] is False
        assert record["config"]["learning_rate"] == 1e-3
        assert record["optimizer"]["learning_rate"] == 1e-3 and record["loss"]["name"] == "grpo"
        assert record["client"]["scenario_sha256"] == [CLIENT_HASHES["scenario_sha256"]]
        assert record["client"]["judge_cache_key"] == [CLIENT_HASHES["judge_cache_key"]]
        assert record["start"]["from_step"] == step - 1
        assert record["start"]["fresh_optimizer"] == (step == 1)
        assert (checkpoint / "replay_start_state.pt").is_file() == (step > 1)
        assert (
            record["inputs"]["bytes"] == (checkpoint / "replay_inputs.safetensors").stat().st_size
        )


def test_replaying_step_2_matches_bit_exactly(trained_run: Path):
    result = replay(trained_run, "--model", NAME, "--step", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "match: p/replayed step 2 replayed bit-exactly" in result.stdout
    assert "bit-exact not promised" not in result.stderr


def test_step_1_replays_from_the_fresh_adapter_and_another_thread_count_warns(trained_run: Path):
    result = replay(trained_run, "--model", NAME, "--step", "1", "--threads", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the step ran on 2 thread(s), the replay on 1" in result.stderr
    assert result.stdout.startswith("match")


def test_a_tampered_input_is_a_mismatch_with_exit_code_1(trained_run: Path, tmp_path: Path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = copy_of(trained_run, tmp_path)
    inputs = model_dir(path) / "checkpoints/0002/replay_inputs.safetensors"
    with safe_open(str(inputs), framework="pt") as source:
        tensors = {name: source.get_tensor(name) for name in source.keys()}  # noqa: SIM118
        metadata = source.metadata()
    tensors["advantages"] = -tensors["advantages"]
    save_file(tensors, str(inputs), metadata=metadata)

    result = replay(path, "--model", NAME, "--step", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("mismatch: p/replayed step 2")
    assert "the saved inputs changed since the step" in result.stdout
    assert "lora_A.weight: max |delta|" in result.stdout  # per tensor
    assert "is not what the step trained on" in result.stderr


def test_a_tampered_adapter_hash_is_a_mismatch_with_exit_code_1(trained_run: Path, tmp_path: Path):
    path = copy_of(trained_run, tmp_path)
    manifest_file = model_dir(path) / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["steps"]["3"]["adapter_sha256"] = "0" * 64
    manifest_file.write_text(json.dumps(manifest))

    result = replay(path, "--model", NAME, "--step", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("mismatch: p/replayed step 3")
    assert "tensors equal checkpoint 3's" in result.stdout


def test_steps_that_cannot_be_replayed_raise_named_errors_that_say_what_to_do(
    trained_run: Path, tmp_path: Path
):
    from art_backend._errors import ReplayInputMissingError, StoreNotFoundError
    from art_backend.training._replay import replay_step

    with pytest.raises(StoreNotFoundError, match="pass the --path art-server used"):
        replay_step(trained_run, "nobody", 1)
    with pytest.raises(StoreNotFoundError, match=r"no recorded step 9 \(recorded: \[1, 2, 3\]"):
        replay_step(trained_run, NAME, 9)
    path = copy_of(trained_run, tmp_path)
    (model_dir(path) / "checkpoints/0002/replay_inputs.safetensors").unlink()
    with pytest.raises(ReplayInputMissingError, match="Restore the file"):
        replay_step(path, NAME, 2)
    shutil.rmtree(model_dir(path) / "checkpoints/0001")
    with pytest.raises(StoreNotFoundError, match="checkpoint may have been deleted"):
        replay_step(path, NAME, 1)
    result = replay(path, "--model", NAME, "--step", "2")
    assert result.returncode == 2
    assert result.stderr.startswith("art replay: ReplayInputMissingError:")


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garble(path: Path) -> None:
    path.write_bytes(bytes(range(7, 250)) * 3)


def into_a_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def edit_json(change: Callable[[Any], object]) -> Callable[[Path], None]:
    """A damage that parses the JSON file, changes it in place, and writes it back."""

    def damage(path: Path) -> None:
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))

    return damage


# Every file a replay of step 2 reads, and what the message advises for it.
REPLAY_FILES = {
    "manifest.json": "restore it from a backup of the model folder",
    "checkpoints/0002/replay.json": "or replay another step",
    "checkpoints/0002/replay_inputs.safetensors": "or replay another step",
    "checkpoints/0001/adapter_model.safetensors": "step 2 starts from it",
    "checkpoints/0002/replay_start_state.pt": "AdamW's moments differ",
    "checkpoints/0002/adapter_model.safetensors": "compares its result with this adapter",
}
DAMAGES = {"cut short": cut_short, "garbled": garble, "a folder": into_a_folder}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("file", REPLAY_FILES)
def test_a_damaged_replay_file_is_one_line_naming_it_and_exit_2(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, file: str, damage: str
):
    from art_backend.training import replay_cli

    path = copy_of(trained_run, tmp_path)
    DAMAGES[damage](model_dir(path) / file)
    code = replay_cli.main(["--path", str(path), "--model", NAME, "--step", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", err
    assert err.startswith(f"art replay: StoreFileDamagedError: {model_dir(path) / file} ")
    assert REPLAY_FILES[file] in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("file", "damage", "says"),
    [
        ("manifest.json", lambda path: path.write_text("[]"), "JSON that is not an object"),
        ("manifest.json", edit_json(lambda manifest: manifest.pop("model")), "KeyError: 'model'"),
        ("checkpoints/0002/replay.json", edit_json(lambda r: r.pop("start")), "'start'"),
        (
            "checkpoints/0002/replay.json",
            edit_json(lambda record: record.update(threads=100_000)),
            "threads 100000 is not a count from 1 to",
        ),
        (
            "checkpoints/0002/replay.json",
            edit_json(lambda record: record["optimizer"].update(learning_rate="fast")),
            "optimizer.learning_rate is 'fast', not a number",
        ),
    ],
)  # fmt: skip
def test_a_replay_file_with_a_field_missing_or_out_of_range_is_named(
    trained_run: Path, tmp_path: Path, file: str, damage: Callable[[Path], None], says: str
):
    from art_backend._errors import StoreFileDamagedError
    from art_backend.training._replay import replay_step

    path = copy_of(trained_run, tmp_path)
    damage(model_dir(path) / file)
    with pytest.raises(StoreFileDamagedError, match=f"{re.escape(file)} cannot be used") as caught:
        replay_step(path, NAME, 2)
    assert says in str(caught.value)


def test_art_replay_refuses_a_damaged_inputs_file_in_its_own_process(
    trained_run: Path, tmp_path: Path
):
    path = copy_of(trained_run, tmp_path)
    cut_short(model_dir(path) / "checkpoints/0002/replay_inputs.safetensors")
    result = replay(path, "--model", NAME, "--step", "2")
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "replay_inputs.safetensors cannot be used to replay the step" in result.stderr


def test_a_thread_count_torch_would_crash_on_is_refused_with_exit_2(tmp_path: Path):
    """100,000 threads made torch segfault (exit 139, no output)."""
    from art_backend.engines._thread_settings import max_threads

    result = replay(tmp_path, "--model", NAME, "--step", "1", "--threads", "100000")
    assert result.returncode == 2 and result.stdout == ""
    assert f"argument --threads: 100000 is more than {max_threads()}" in result.stderr
    from art_backend._errors import InvalidRequestError
    from art_backend.training._replay import replay_step

    with pytest.raises(InvalidRequestError, match="threads=100000: give a count from 1 to"):
        replay_step(tmp_path, NAME, 1, threads=100_000)


@pytest.mark.parametrize(
    ("tolerance", "why"),
    [("-1", "-1 is less than 0"), ("nan", "'nan' is not a finite number"),
     ("inf", "'inf' is not a finite number"), ("tight", "'tight' is not a number")],
)  # fmt: skip
def test_a_negative_or_non_finite_tolerance_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tolerance: str, why: str
):
    """`worst <= nan` or `<= -1` is never true: every replay would have been a mismatch."""
    from art_backend.training import replay_cli

    with pytest.raises(SystemExit) as exited:
        replay_cli.main(["--path", str(tmp_path), "--model", NAME, "--step", "1",
                         "--tolerance", tolerance])  # fmt: skip
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == f"art replay: error: argument --tolerance: {why}"
    from art_backend._errors import InvalidRequestError
    from art_backend.training._replay import replay_step

    with pytest.raises(InvalidRequestError, match="give a finite number of at least 0"):
        replay_step(tmp_path, NAME, 1, tolerance=float(tolerance.replace("tight", "-0.5")))


def test_the_art_command_runs_replay_and_refuses_step_0(tmp_path: Path):
    art_command = Path(sys.executable).with_name("art")
    assert art_command.is_file(), "no `art` next to python: pip install -e . registers it"
    result = subprocess.run(
        [str(art_command), "replay", "--model", NAME, "--step", "0", "--path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert "art replay: error: argument --step: 0 is less than 1" in result.stderr


def test_scenario_hash_is_the_sha256_of_the_scenario_s_canonical_json():
    canonical = '{"difficulty":1,"task":"Réserve un vol"}'
    expected = hashlib.sha256(canonical.encode()).hexdigest()
    assert scenario_hash({"task": "Réserve un vol", "difficulty": 1}) == expected
    assert scenario_hash({"difficulty": 1, "task": "Réserve un vol"}) == expected
    scenario = art.Scenario(task="Réserve un vol", difficulty=1)
    assert scenario_hash(scenario) == scenario_hash(scenario.model_dump(mode="json"))
    with pytest.raises(TypeError, match="not JSON data"):
        scenario_hash({"task": object()})
