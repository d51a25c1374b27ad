"""Lines of ART's newest examples that name what ART's docs call: ART's fork-pipeline example
(`dev/yes-no-maybe-fork-pipeline.py`: its DEDICATED_CONFIG and `deploy_wandb`), tic-tac-toe's
`deploy_model`, and `LocalBackend(in_process=True)`, each with only the import changed. What
would only place, size or host the work warns or says where the files are; what would compute
something else (4- or 8-bit weights) is refused by name."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

import art_core as art
from art_core.dev import IgnoredSettingWarning
from art_core.local import LocalBackend

BASE_MODEL_NAME = "ynm-fork-pipeline-llama-31-8b-base"
PROJECT = "yes-no-maybe-fork-pipeline"


def test_the_fork_pipelines_dedicated_config_applies_and_warns_for_the_rest():
    DEDICATED_CONFIG: art.dev.InternalModelConfig = {
        "trainer_gpu_ids": [0],
        "inference_gpu_ids": [1],
        "init_args": {
            "max_seq_length": 2048,
            "load_in_4bit": False,
            "load_in_16bit": True,
        },
        "engine_args": {
            "gpu_memory_utilization": 0.4,
            "max_model_len": 2048,
            "max_num_seqs": 16,
            "enforce_eager": True,
        },
    }
    with pytest.warns(IgnoredSettingWarning) as ignored:
        model_a = art.TrainableModel(
            run_name=BASE_MODEL_NAME,
            name=BASE_MODEL_NAME,
            project=PROJECT,
            base_model="tiny",
            _internal_config=DEDICATED_CONFIG,
        )
    assert model_a.engine_settings == {"max_length": 2048, "max_batch_size": 16}
    said = [str(warning.message) for warning in ignored]
    for setting in ("init_args.load_in_4bit=False", "init_args.load_in_16bit=True"):
        [warning] = [message for message in said if setting in message]
        assert "never quantizes" in warning and "LocalBackend(dtype=" in warning
    assert len(said) == 6  # and the two GPU ids, the memory share, enforce_eager


@pytest.mark.parametrize(
    "init_args", [{"load_in_4bit": True}, {"load_in_8bit": True}, {"load_in_4bit": 1}]
)
def test_quantized_weights_are_refused_naming_the_key(init_args: dict):
    key = next(iter(init_args))
    with pytest.raises(art.UnsupportedOptionError, match=rf"init_args\.{key}=.*never quantizes"):
        art.TrainableModel(name="a", base_model="tiny", _internal_config={"init_args": init_args})  # type: ignore[typeddict-item]


def test_unquantized_loads_of_every_width_are_what_the_backend_does():
    for init_args in ({"load_in_8bit": False}, {"load_in_16bit": False}):
        with pytest.warns(IgnoredSettingWarning, match="never quantizes"):
            model = art.TrainableModel(
                name="a", base_model="tiny", _internal_config={"init_args": init_args}
            )
        assert model.engine_settings == {}


def test_in_process_warns_and_the_backend_still_runs_in_a_child_process(tmp_path: Path):
    with pytest.warns(IgnoredSettingWarning, match=r"in_process=True.*child process"):
        backend = LocalBackend(in_process=True, path=tmp_path)
    assert backend.process is None  # started by the first register, as always
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LocalBackend(in_process=False, path=tmp_path)  # what it does anyway: no warning


def test_the_fork_pipelines_push_to_wandb_says_where_the_adapter_is(tmp_path: Path):
    from art_core.utils.deployment.wandb import deploy_wandb
    from art_core.utils.output_dirs import get_model_dir, get_step_checkpoint_dir

    model = art.TrainableModel(name=BASE_MODEL_NAME, project=PROJECT, base_model="tiny")
    checkpoint_path = get_step_checkpoint_dir(get_model_dir(model, str(tmp_path)), 5)
    with pytest.raises(art.UnsupportedOptionError) as refused:
        deploy_wandb(model, checkpoint_path, 5, verbose=True)
    message = str(refused.value)
    assert checkpoint_path in message and "wandb.Artifact" in message
    assert f"model={BASE_MODEL_NAME}@5" in message
    from art_core.utils.deployment import deploy_wandb as at_the_package

    assert at_the_package is deploy_wandb


async def test_tic_tac_toes_deploy_model_to_together_says_where_the_adapter_is():
    from art_core.utils.deployment import TogetherDeploymentConfig, deploy_model

    model = art.TrainableModel(name="tic-tac-toe-001", project="tic-tac-toe", base_model="tiny")
    checkpoint_path = "/art/tic-tac-toe/models/tic-tac-toe-001/checkpoints/0012"
    with pytest.raises(art.UnsupportedOptionError, match=rf"Together.*{checkpoint_path}"):
        await deploy_model(
            model=model,
            checkpoint_path=checkpoint_path,
            step=12,
            provider="together",
            config=TogetherDeploymentConfig(
                s3_bucket=os.environ.get("BACKUP_BUCKET"),
                wait_for_completion=True,
            ),
            verbose=True,
        )
    with pytest.raises(ValueError, match="'together' or 'wandb'"):
        await deploy_model(model, checkpoint_path, 12, provider="azure")  # type: ignore[arg-type]
    with pytest.raises(art.UnknownFieldError, match="s3_bucket"):
        TogetherDeploymentConfig(bucket="b")  # type: ignore[call-arg]
