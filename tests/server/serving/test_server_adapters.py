"""LoRA checkpoints served as `name@step` beside the base model, over HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.adapters import make_random_adapter
from tests.support.servers import running_server

QUESTION = [{"role": "user", "content": "which adapter answers?"}]


@pytest.fixture(scope="module")
def adapter_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    art_path = tmp_path_factory.mktemp("art-adapters")
    checkpoints = art_path / "demo" / "models" / "agent" / "checkpoints"
    make_random_adapter(tiny_model_dir, checkpoints / "0001", seed=1)
    make_random_adapter(tiny_model_dir, checkpoints / "0002", seed=2)
    with running_server(tiny_model_dir, art_path) as running:
        yield running


def greedy_ids(client: openai.OpenAI, model: str) -> list[int]:
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=8, temperature=0
    )
    return reply.choices[0].model_extra["token_ids"]


def test_checkpoints_under_path_are_served_at_startup(adapter_server):
    client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    assert [model.id for model in client.models.list()] == ["tiny", "agent", "agent@1", "agent@2"]


def test_each_step_answers_with_its_own_weights(adapter_server):
    client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    outputs = {model: greedy_ids(client, model) for model in ("tiny", "agent@1", "agent@2")}
    assert outputs["tiny"] != outputs["agent@1"] != outputs["agent@2"]


async def test_steps_mixed_in_one_batch_match_their_solo_outputs(adapter_server):
    sync_client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    models = ["tiny", "agent@1", "agent@2"] * 3
    solo = {model: greedy_ids(sync_client, model) for model in set(models)}
    client = openai.AsyncOpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=model, messages=QUESTION, max_tokens=8, temperature=0
            )
            for model in models
        )
    )
    for model, reply in zip(models, replies, strict=True):
        assert reply.choices[0].model_extra["token_ids"] == solo[model]


def test_a_new_checkpoint_is_loaded_on_request(adapter_server, tiny_model_dir):
    folder = adapter_server.art_path / "demo" / "models" / "agent" / "checkpoints" / "0003"
    make_random_adapter(tiny_model_dir, folder, seed=3)
    response = httpx.post(
        f"{adapter_server.url}/v1/adapters", json={"name": "agent@3", "path": str(folder)}
    )
    assert response.status_code == 200, response.text
    client = openai.OpenAI(base_url=f"{adapter_server.url}/v1", api_key="x", max_retries=0)
    assert "agent@3" in [model.id for model in client.models.list()]
    assert len(greedy_ids(client, "agent@3")) == 8


def test_missing_adapter_folder_is_a_400(adapter_server):
    folder = adapter_server.art_path / "demo" / "models" / "agent" / "checkpoints" / "0009"
    response = httpx.post(
        f"{adapter_server.url}/v1/adapters", json={"name": "agent@9", "path": str(folder)}
    )
    assert response.status_code == 400
    assert "adapter_config.json" in response.json()["error"]["message"]


def _lora_config(**fields) -> str:
    return json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"], **fields})


# (adapter_config.json text, words the 400's message must contain): each was a 500 once
# (KeyError 'peft_type', JSONDecodeError, PEFT failing after it had wrapped the model's layers).
BAD_ADAPTER_FOLDERS = [
    ("{}", '"peft_type": null'),
    ("not json", "is not JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"peft_type": "PREFIX_TUNING"}), "LoRA adapters only"),
    (_lora_config(r="four"), '"r" must be a positive integer'),
    (_lora_config(r=0), '"r" must be a positive integer'),
    (_lora_config(lora_alpha="x"), '"lora_alpha" must be a number'),
    (_lora_config(target_modules=["attention_of_another_model"]), "match no module"),
    (_lora_config(target_modules="(unclosed"), "not a regular expression"),
    (_lora_config(target_modules=7), "must be a list"),
    (_lora_config(), "adapter_model.safetensors is missing"),
]


@pytest.mark.parametrize(
    ("config_text", "words"), BAD_ADAPTER_FOLDERS, ids=[w for _, w in BAD_ADAPTER_FOLDERS]
)
def test_a_bad_adapter_folder_is_a_400_naming_path(adapter_server, config_text, words):
    folder = adapter_server.art_path / "demo" / "models" / "bad" / "checkpoints" / "0001"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(config_text)
    assert_refused_loading_nothing(adapter_server, "bad@1", folder, words)


def assert_refused_loading_nothing(server, name: str, folder: Path, words: str) -> None:
    """POST /v1/adapters is a 400 on `path` saying `words`, and nothing was half-loaded: the
    served models, the base model's answers and the adapters already served are unchanged."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    base_answer = greedy_ids(client, "tiny")
    response = httpx.post(f"{server.url}/v1/adapters", json={"name": name, "path": str(folder)})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "path" and words in error["message"], error["message"]
    assert name not in [model.id for model in client.models.list()]
    assert greedy_ids(client, "tiny") == base_answer
    assert greedy_ids(client, "agent@1")


def test_a_pickled_weights_file_is_never_read(adapter_server, tiny_model_dir):
    folder = adapter_server.art_path / "demo" / "models" / "pickled" / "checkpoints" / "0001"
    make_random_adapter(tiny_model_dir, folder, seed=4)
    (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    response = httpx.post(
        f"{adapter_server.url}/v1/adapters", json={"name": "pickled@1", "path": str(folder)}
    )
    assert response.status_code == 400
    assert "only safetensors" in response.json()["error"]["message"]


def widen(weights: Path) -> None:
    """LoRA weights of a wider model (hidden size +32): another base model's adapter."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    save_file(
        {
            key: tensor.new_zeros(
                (tensor.shape[0], tensor.shape[1] + 32)
                if "lora_A" in key
                else (tensor.shape[0] + 32, tensor.shape[1])
            )
            for key, tensor in tensors.items()
        },
        weights,
    )


def configure(weights: Path, **fields) -> None:
    """Rewrite the adapter_config.json beside `weights` with these fields changed."""
    config_path = weights.parent / "adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **fields}))


# How the weights file is spoiled, and what the 400 says: each was a 500 (PEFT failing, some
# after it had wrapped the model's layers; a config whose `r` is not the weights' rank: "size
# mismatch").
SPOILED_WEIGHTS = [
    (widen, "trained on another base model"),
    (lambda weights: weights.write_bytes(weights.read_bytes()[:-100]), "truncated"),
    (lambda weights: weights.write_bytes(b"\x10" + b"\x00" * 7 + b"garbage!" * 2), "header"),
    (lambda weights: weights.write_bytes(b""), "fewer than a safetensors header"),
    (lambda weights: weights.write_bytes(b"\xff" * 64), "more bytes than the file holds"),
    (lambda weights: configure(weights, r=16), "lora_A.weight has rank 4 (shape"),
    (lambda weights: configure(weights, r=16), 'but adapter_config.json says "r": 16'),
    (
        lambda weights: configure(weights, r=4, rank_pattern={"v_proj": 8}),
        "v_proj.lora_A.weight has rank 4 (shape",
    ),
    (
        lambda weights: configure(weights, r=4, rank_pattern={"v_proj": 8}),
        'says "rank_pattern" {"v_proj": 8}',
    ),
    # Accepted before: PEFT built DoRA layers (a magnitude from the base weights) that the
    # engine's mixed batches refuse and the trainer never trains: not the adapter it claimed.
    (lambda weights: configure(weights, use_dora=True), '"use_dora": true'),
]


@pytest.mark.parametrize(
    ("spoil", "words"),
    SPOILED_WEIGHTS,
    ids=[
        "another-base-model",
        "truncated",
        "garbage-header",
        "empty",
        "huge-header-length",
        "rank-not-r",
        "r-named",
        "rank-pattern",
        "rank-pattern-named",
        "dora",
    ],
)
def test_weights_that_do_not_fit_or_are_damaged_are_a_400(
    adapter_server, tiny_model_dir, spoil, words
):
    folder = adapter_server.art_path / "demo" / "models" / "spoiled" / "checkpoints" / "0001"
    make_random_adapter(tiny_model_dir, folder, seed=5)
    spoil(folder / "adapter_model.safetensors")
    assert_refused_loading_nothing(adapter_server, "spoiled@1", folder, words)


@pytest.mark.parametrize("linked", ["adapter_model.safetensors", "adapter_config.json"])
def test_an_adapter_file_linking_out_of_path_is_refused(
    adapter_server, tiny_model_dir, tmp_path, linked
):
    """The folder lies inside --path, one of its files is a link to a file outside it."""
    outside = tmp_path / "outside"
    make_random_adapter(tiny_model_dir, outside, seed=6)
    folder = adapter_server.art_path / "demo" / "models" / f"linked-{linked[8:14]}" / "0001"
    make_random_adapter(tiny_model_dir, folder, seed=6)
    (folder / linked).unlink()
    (folder / linked).symlink_to(outside / linked)

    response = httpx.post(
        f"{adapter_server.url}/v1/adapters", json={"name": "linked@1", "path": str(folder)}
    )

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "path" and f"{linked} in" in error["message"]
    assert "links outside the server's --path" in error["message"]
