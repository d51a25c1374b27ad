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
from tests.support.processes import art_server_refusal
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


TEXTS = [
    "What is the capital of France? The capital of France is Paris.",
    "  two leading spaces, tabs\tand\nnew lines; unseen words: zyzzyva, Größe, 東京 🙂",
    "<|im_start|>user\nhello<|im_end|>\n<start_of_turn>model\n0 1 2 + - * / = ( )<end_of_turn>",
]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_converted_tokenizer_gives_the_ids_transformers_reads_from_the_gguf(
    family: str, ggufs: Path, tmp_path: Path
) -> None:
    """The conversion reads the file through one shared, quicker gguf reader (_parsed_once):
    the tokenizer it saves encodes as transformers' own reading of the file does."""
    from transformers import AutoTokenizer

    converted = AutoTokenizer.from_pretrained(_converted(ggufs / f"{family}.gguf", tmp_path))
    reference = AutoTokenizer.from_pretrained(ggufs, gguf_file=f"{family}.gguf")

    assert len(converted) == len(reference)
    for text in TEXTS:
        assert converted(text)["input_ids"] == reference(text)["input_ids"], text


def test_a_conversion_parses_the_file_once(
    ggufs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49: transformers parsed the file with gguf's reader for the config, the tokenizer and
    the weights, and we once more for the header: 4 parses, 9 s of CPU each for Gemma 3's 262k
    vocabulary. Now the header is walked without it, and its three calls share one reader."""
    import gguf

    original = gguf.GGUFReader
    parsed: list[str] = []
    parse = original.__init__

    def counted(reader: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        parsed.append(Path(path).name)
        parse(reader, path, *args, **kwargs)

    monkeypatch.setattr(original, "__init__", counted)
    _converted(ggufs / "gemma3.gguf", tmp_path)

    assert parsed == ["gemma3.gguf"]
    assert gguf.GGUFReader is original  # put back once the conversion is done


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
    assert list((tmp_path / "cache").iterdir()) == []  # no folder, temporary folder or lock


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


def _cut_points(gguf_path: Path) -> dict[str, int]:
    """Where to cut `gguf_path` to land in each part of it (offsets from gguf's own reader)."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    vocabulary = reader.fields["tokenizer.ggml.tokens"].offset
    return {
        "the magic": 2,
        "the counts": 20,
        "the first key": 30,
        "the vocabulary": vocabulary + 1_000,
        "the tensor table": reader.tensors[0].field.offset + 5,
        "the tensor data": reader.data_offset + 64,
        "the last byte": gguf_path.stat().st_size - 1,
    }


def test_a_gguf_cut_anywhere_or_garbled_is_refused_before_anything_is_written(
    ggufs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 49: a cut in the header raised IndexError out of gguf's reader (a traceback); a
    cut is a clean refusal wherever it falls, before the cache is touched or a conversion is
    announced."""
    whole = (ggufs / "gemma3.gguf").read_bytes()
    broken = {
        f"cut in {part}": whole[:at] for part, at in _cut_points(ggufs / "gemma3.gguf").items()
    }
    broken["empty"] = b""
    key_end = 24 + 8 + len(b"general.architecture")  # the header, the key's length and name
    broken["garbled"] = whole[:key_end] + (99).to_bytes(4, "little") + whole[key_end + 4 :]

    for what, data in broken.items():
        path = tmp_path / "model.gguf"
        path.write_bytes(data)
        with pytest.raises(ModelLoadError, match="is not a readable GGUF file") as raised:
            resolve_model_source(str(path), cache_dir=tmp_path / "cache")
        assert "Check that the download is complete" in str(raised.value), what
        assert not (tmp_path / "cache").exists(), what
    assert "converting" not in capsys.readouterr().err


def test_art_server_refuses_a_cut_gguf_in_one_line(
    ggufs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut of issue 49 (in the vocabulary: IndexError, exit 1), through the real command."""
    monkeypatch.setenv("ART_CACHE_DIR", str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    at = _cut_points(ggufs / "qwen2.gguf")["the vocabulary"]
    cut.write_bytes((ggufs / "qwen2.gguf").read_bytes()[:at])

    refusal = art_server_refusal("--model", str(cut), "--path", str(tmp_path / "art"))

    assert f"art-server: error: '{cut}' is not a readable GGUF file (it ends at byte" in refusal
    assert "Check that the download is complete" in refusal
    assert "converting" not in refusal
    assert not (tmp_path / "cache").exists()


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
