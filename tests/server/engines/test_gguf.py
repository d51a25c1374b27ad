"""A GGUF file of any family transformers reads is served: converted once, stopping at its turn ends.

The files are written here (tests/support/tiny_gguf.py): tiny random models of three families,
F32, with llama.cpp's metadata keys and tensor layouts.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from art_backend.engines._loading import resolve_model_source
from art_backend.engines._stop_tokens import END_OF_TURN_TOKENS, stop_token_ids
from art_backend.testing import ModelLoadError, load_model
from tests.support.servers import running_server
from tests.support.tiny_gguf import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    write_metadata_only_gguf,
    write_tiny_gguf,
)

FAMILIES = ["qwen2", "gemma3", "llama"]


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding qwen2.gguf, gemma3.gguf and llama.gguf."""
    folder = tmp_path_factory.mktemp("ggufs")
    for family in FAMILIES:
        write_tiny_gguf(folder / f"{family}.gguf", family)
    return folder


def _saved(folder: Path, name: str) -> dict[str, Any]:
    return json.loads((folder / name).read_text())


def _converted(model: Path | str, cache_dir: Path) -> Path:
    """The folder `model` (a GGUF file or its folder) is converted into."""
    source = resolve_model_source(str(model), cache_dir=cache_dir)
    assert isinstance(source, Path)
    return source


# --- the converted folder ----------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_the_converted_model_gives_the_logits_transformers_reads_from_the_gguf(
    family: str, ggufs: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    loaded = load_model(str(ggufs / f"{family}.gguf"), dtype="float32", cache_dir=tmp_path)
    reference: Any = AutoModelForCausalLM.from_pretrained(
        ggufs, gguf_file=f"{family}.gguf", dtype=torch.float32
    )

    assert isinstance(loaded.source, Path) and loaded.source.parent == tmp_path
    assert "quantization_config" not in _saved(loaded.source, "config.json")
    assert type(loaded.model) is type(reference)
    input_ids = torch.randint(0, reference.config.vocab_size, (2, 12), generator=torch.Generator())
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids).logits, reference(input_ids).logits)
    embed = loaded.model.get_input_embeddings().weight
    head = loaded.model.get_output_embeddings().weight
    assert (embed.data_ptr() == head.data_ptr()) == reference.config.tie_word_embeddings


@pytest.mark.parametrize(
    ("family", "stops"),
    [
        # Gemma 3 declares <eos> and <end_of_turn> (as eot_token_id): issue 37's missing stop.
        ("gemma3", ["<eos>", "<end_of_turn>"]),
        # Qwen2's file declares <|endoftext|> only; <|im_end|> comes from the end-of-turn table.
        ("qwen2", ["<|endoftext|>", "<|im_end|>"]),
    ],
)
def test_declared_and_end_of_turn_tokens_are_stop_tokens_and_saved(
    family: str, stops: list[str], ggufs: Path, tmp_path: Path
) -> None:
    loaded = load_model(str(ggufs / f"{family}.gguf"), dtype="float32", cache_dir=tmp_path)
    ids = loaded.tokenizer.convert_tokens_to_ids(stops)

    assert loaded.eos_token_ids == ids
    assert isinstance(loaded.source, Path)
    assert _saved(loaded.source, "generation_config.json")["eos_token_id"] == ids
    if family == "gemma3":
        assert ids[1] == 106


@pytest.mark.parametrize(
    ("family", "template"), [("gemma3", GEMMA_TEMPLATE), ("qwen2", CHATML_TEMPLATE)]
)
def test_the_chat_template_in_the_gguf_is_kept(
    family: str, template: str, ggufs: Path, tmp_path: Path
) -> None:
    loaded = load_model(str(ggufs / f"{family}.gguf"), dtype="float32", cache_dir=tmp_path)

    assert loaded.tokenizer.chat_template == template


def test_a_gguf_without_a_chat_template_gets_none_invented(tmp_path: Path) -> None:
    gguf_path = write_tiny_gguf(tmp_path / "base.gguf", "qwen2", chat_template=None)

    loaded = load_model(str(gguf_path), dtype="float32", cache_dir=tmp_path / "cache")

    assert not loaded.tokenizer.chat_template


# --- the cache -------------------------------------------------------------------------------


def test_a_second_load_reuses_the_converted_folder(
    ggufs: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="art_backend.loading"):
        first = _converted(ggufs / "qwen2.gguf", tmp_path)
        assert "Converting qwen2.gguf" in caplog.text
        for stage in ("reading:", "dequantizing:", "writing:"):
            assert stage in caplog.text
        weights = (first / "model.safetensors").stat().st_mtime_ns
        caplog.clear()
        second = _converted(ggufs / "qwen2.gguf", tmp_path)

    assert second == first
    assert first.name.startswith("qwen2-")
    assert "Converting" not in caplog.text
    assert (first / "model.safetensors").stat().st_mtime_ns == weights


def test_a_file_replaced_in_place_is_converted_again(tmp_path: Path) -> None:
    gguf_path = write_tiny_gguf(tmp_path / "model.gguf", "qwen2", seed=0)
    first = _converted(gguf_path, tmp_path / "cache")
    write_tiny_gguf(gguf_path, "qwen2", seed=1)

    second = _converted(gguf_path, tmp_path / "cache")

    assert second != first
    assert (second / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()


# --- what --model may name -------------------------------------------------------------------


def test_a_folder_holding_one_gguf_loads_it(ggufs: Path, tmp_path: Path) -> None:
    folder = tmp_path / "downloaded"
    folder.mkdir()
    shutil.copy(ggufs / "gemma3.gguf", folder / "gemma-3-tiny-Q8_0.gguf")

    loaded = load_model(str(folder), dtype="float32", cache_dir=tmp_path / "cache")

    assert isinstance(loaded.source, Path)
    assert loaded.source.name.startswith("gemma-3-tiny-Q8_0-")
    assert type(loaded.model).__name__ == "Gemma3ForCausalLM"


def test_a_folder_holding_two_ggufs_is_refused_naming_them(ggufs: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="pass one of them") as raised:
        resolve_model_source(str(ggufs), cache_dir=tmp_path)

    for family in FAMILIES:
        assert f"{family}.gguf" in str(raised.value)


def test_an_architecture_transformers_cannot_read_is_refused_naming_it(tmp_path: Path) -> None:
    gguf_path = write_metadata_only_gguf(tmp_path / "rwkv.gguf", "rwkv6")

    with pytest.raises(ModelLoadError, match="'rwkv6' model") as raised:
        resolve_model_source(str(gguf_path), cache_dir=tmp_path / "cache")

    message = str(raised.value)
    assert "Supported GGUF architectures: " in message
    for supported in ("gemma3", "llama", "qwen2"):
        assert supported in message
    left = [path.name for path in (tmp_path / "cache").iterdir() if path.suffix != ".lock"]
    assert left == []  # neither a converted folder nor a temporary one


def test_one_part_of_a_split_gguf_is_refused_saying_to_merge(tmp_path: Path) -> None:
    part = write_metadata_only_gguf(tmp_path / "big-00001-of-00003.gguf", "qwen2", split_count=3)

    with pytest.raises(ModelLoadError, match="split into 3 files") as raised:
        resolve_model_source(str(part), cache_dir=tmp_path / "cache")

    assert "llama-gguf-split --merge" in str(raised.value)


def test_a_missing_gguf_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"Local model file .*missing\.gguf' does not exist"):
        resolve_model_source(str(tmp_path / "missing.gguf"), cache_dir=tmp_path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_source("missing.gguf", cache_dir=tmp_path)


def test_a_gguf_file_without_the_suffix_is_recognised_by_its_content(
    ggufs: Path, tmp_path: Path
) -> None:
    blob = tmp_path / "blobs" / "sha256-0123abcd"  # how Ollama stores a model
    blob.parent.mkdir()
    shutil.copy(ggufs / "qwen2.gguf", blob)

    assert _converted(blob, tmp_path / "cache").name.startswith("sha256-0123abcd-")


def test_a_file_that_is_not_a_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf at all")

    with pytest.raises(ModelLoadError, match="is a file but not a GGUF file"):
        resolve_model_source(str(tmp_path / "notes.txt"), cache_dir=tmp_path / "cache")
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        resolve_model_source(str(tmp_path / "broken.gguf"), cache_dir=tmp_path / "cache")


# --- stop tokens -----------------------------------------------------------------------------


def _tokenizer(*added: str) -> Any:
    """A word-level tokenizer with eos </s>, a plain word spelled <|im_end|>, and `added` specials."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "<|im_end|>": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(added)})
    return tokenizer


def test_an_end_of_turn_token_stops_only_as_an_added_token() -> None:
    plain = _tokenizer()
    assert stop_token_ids(plain) == [1]

    eot = _tokenizer("<|eot_id|>", "<end_of_turn>")
    assert stop_token_ids(eot, declared=[1, None, 99_999]) == [
        1,
        *eot.convert_tokens_to_ids(["<end_of_turn>", "<|eot_id|>"]),
    ]


def test_harmony_end_closes_a_message_not_the_turn() -> None:
    phi = _tokenizer("<|end|>")
    harmony = _tokenizer("<|end|>", "<|return|>", "<|call|>")

    assert stop_token_ids(phi) == [1, phi.convert_tokens_to_ids("<|end|>")]
    assert stop_token_ids(harmony) == [
        1,
        *harmony.convert_tokens_to_ids(["<|return|>", "<|call|>"]),
    ]


def test_the_end_of_turn_table_names_each_token_once() -> None:
    tokens = [row.token for row in END_OF_TURN_TOKENS]
    assert len(tokens) == len(set(tokens))
    assert {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>"} <= set(tokens)


# --- end to end ------------------------------------------------------------------------------


def test_a_server_on_a_gguf_file_answers_and_stops_at_the_end_of_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_CACHE_DIR", str(tmp_path / "cache"))
    # The file declares <|endoftext|> as eos; this model says <|im_end|> after any input.
    gguf_path = write_tiny_gguf(tmp_path / "answers.gguf", "qwen2", answer="<|im_end|>")

    with running_server(gguf_path, tmp_path / "art") as server:
        reply = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
            },
            timeout=60,
        )

    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"]["content"] == ""
    assert body["usage"]["completion_tokens"] == 1
    assert any(
        path.name.startswith("answers-") for path in (tmp_path / "cache" / "models").iterdir()
    )
