"""ART's warm start from an SFT LoRA: `TrainableModel(base_model="/path/to/my_sft_lora_adapter")`.

A PEFT adapter of the tiny model, saved as PEFT saves it, is named as the base model: the model
registers on the adapter's own base model, with the adapter's LoRA settings, and its step 0 is
the adapter's weights (byte for byte), from which it trains on. What cannot start that way is
refused by name, on the client and again on the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

import art_core as art
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer, running_server


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("art-adapter")) as running:
        yield running


@pytest.fixture(scope="module")
def sft_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rank-4 LoRA of the tiny model on q_proj and v_proj, its B weights non-zero (trained)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in peft.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    folder = tmp_path_factory.mktemp("my_sft_lora_adapter")
    peft.save_pretrained(folder)
    return folder


async def test_a_model_named_after_an_adapter_folder_starts_from_its_weights(
    server: RunningServer, sft_adapter: Path, tiny_model_dir: Path
):
    model = art.TrainableModel(name="warm", project="adapters", base_model=str(sft_adapter))
    backend = art.RemoteBackend(server.url)
    await model.register(backend)
    info = await backend._request("GET", backend._model_path(model))
    assert info["base_model"] == str(tiny_model_dir)
    assert (info["lora"]["r"], info["lora"]["alpha"]) == (4, 8.0)
    assert sorted(info["lora"]["target_modules"]) == ["q_proj", "v_proj"]
    step0 = server.art_path / "adapters" / "models" / "warm" / "checkpoints" / "0000"
    weights = "adapter_model.safetensors"
    assert (step0 / weights).read_bytes() == (sft_adapter / weights).read_bytes()
    groups = varied_group(await groups_for(model, ["Say a word."], per_group=2))
    result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    assert result.step == 1  # trains on from the adapter
    await model.backend.close()


async def test_lora_settings_that_differ_from_the_adapters_are_refused(
    server: RunningServer, sft_adapter: Path
):
    model = art.TrainableModel(
        name="mismatch", project="adapters", base_model=str(sft_adapter), lora={"r": 8}
    )
    with pytest.raises(art.UnsupportedOptionError, match=r"'r': \(8, 4\)"):
        await model.register(art.RemoteBackend(server.url))


def _copy_adapter(source: Path, target: Path, **config_changes) -> Path:
    target.mkdir()
    config = json.loads((source / "adapter_config.json").read_text())
    config.update(config_changes)
    (target / "adapter_config.json").write_text(json.dumps(config))
    (target / "adapter_model.safetensors").write_bytes(
        (source / "adapter_model.safetensors").read_bytes()
    )
    return target


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"base_model_name_or_path": None}, "names no base_model_name_or_path"),
        ({"target_modules": "q_proj|v_proj"}, "not a list of module names"),
        ("pickle", "adapter_model.bin is pickle"),
    ],
)
async def test_an_adapter_folder_that_cannot_start_a_model_is_refused_by_name(
    server: RunningServer, sft_adapter: Path, tmp_path: Path, change, says: str
):
    folder = _copy_adapter(
        sft_adapter, tmp_path / "adapter", **(change if change != "pickle" else {})
    )
    if change == "pickle":
        (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    model = art.TrainableModel(name="refused", project="adapters", base_model=str(folder))
    with pytest.raises(art.UnsupportedOptionError, match=says):
        await model.register(art.RemoteBackend(server.url))


async def test_the_server_checks_the_folder_again(server: RunningServer, tmp_path: Path):
    body = {
        "project": "adapters",
        "name": "raw",
        "base_model": "tiny",
        "init_adapter": str(tmp_path),  # a folder, but no adapter in it
    }
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post("/v1/training/models", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "init_adapter"
    assert "not a LoRA adapter folder" in answer.json()["error"]["message"]
