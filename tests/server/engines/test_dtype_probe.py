"""`--dtype auto` on a CPU: bfloat16 only where it measures clearly faster, cached per machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from art_backend.engines import _dtype_probe, _loading
from art_backend.engines._dtype_probe import (
    BF16_MARGIN,
    CACHE_FILE_NAME,
    choose_cpu_dtype,
    linear_shapes,
    pick_dtype,
)
from art_backend.testing import load_model


@pytest.fixture(autouse=True)
def _cache_in_tmp_path_on_a_quiet_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never the real ~/.cache; and a load average of the test machine never decides a test."""
    monkeypatch.setenv("ART_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ART_DTYPE_PROBE", raising=False)
    monkeypatch.setattr(_dtype_probe, "busy_reason", lambda: None)


@pytest.fixture
def skeleton(tiny_model_dir: Path):
    """The tiny model's architecture on the meta device, as the loader measures it."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))


def fake_timings(monkeypatch: pytest.MonkeyPatch, float32: float, bfloat16: float) -> list[int]:
    """Replace the measurement with fixed seconds per token; the list counts the calls."""
    calls: list[int] = []

    def measure(shapes, *, budget_seconds):
        calls.append(len(shapes))
        return float32, bfloat16

    monkeypatch.setattr(_dtype_probe, "measure_linears", measure)
    return calls


def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(_dtype_probe, "measure_linears", refuse)


# --- what is measured ------------------------------------------------------------------------


def test_the_shapes_are_the_models_linears_with_their_counts(skeleton) -> None:
    vocab = skeleton.config.vocab_size
    # 2 layers of q, o (64->64), k, v (64->32), gate, up (64->128), down (128->64); the head.
    assert linear_shapes(skeleton) == sorted(
        [(64, 64, 4), (64, 32, 4), (64, 128, 4), (128, 64, 2), (64, vocab, 1)]
    )


def test_the_probe_times_both_dtypes_and_says_why(skeleton, tmp_path: Path) -> None:
    choice = choose_cpu_dtype(skeleton, cache_root=tmp_path)

    assert choice.float32_seconds > 0 and choice.bfloat16_seconds > 0
    assert choice.dtype in (torch.float32, torch.bfloat16)
    assert choice.dtype == pick_dtype(choice.float32_seconds, choice.bfloat16_seconds)
    # "bf16 linears 1.4x faster than float32", "... 1.07x faster than float32 (bfloat16 needs
    # 1.11x)" when not enough faster, or "... slower than float32": the measured speeds decide.
    assert re.search(
        r"[\d.]+x (faster|slower) than float32.* at this model's shapes", choice.reason
    )
    assert "measured" in choice.reason and not choice.cached


# --- the decision ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("float32", "bfloat16", "expected"),
    [
        (1.0, 0.5, torch.bfloat16),  # twice as fast
        (1.0, 0.89, torch.bfloat16),  # just past the margin
        (1.0, 0.95, torch.float32),  # faster, but not clearly
        (1.0, 1.21, torch.float32),  # slower (the Xeon without AMX)
    ],
)
def test_bfloat16_only_when_clearly_faster(
    float32: float, bfloat16: float, expected: torch.dtype
) -> None:
    assert BF16_MARGIN == 0.9
    assert pick_dtype(float32, bfloat16) == expected


def test_the_reason_says_how_much_faster_or_slower(
    skeleton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_timings(monkeypatch, 1.0, 0.5)
    faster = choose_cpu_dtype(skeleton, cache_root=tmp_path / "a")
    fake_timings(monkeypatch, 1.0, 1.21)
    slower = choose_cpu_dtype(skeleton, cache_root=tmp_path / "b")
    fake_timings(monkeypatch, 1.0, 0.95)
    close = choose_cpu_dtype(skeleton, cache_root=tmp_path / "c")

    assert faster.dtype == torch.bfloat16
    assert "bf16 linears 2.00x faster than float32" in faster.reason
    assert slower.dtype == torch.float32
    assert "bf16 linears 1.21x slower than float32" in slower.reason
    assert close.dtype == torch.float32
    assert "1.05x faster than float32 (bfloat16 needs 1.11x)" in close.reason


# --- the cache -------------------------------------------------------------------------------


def test_the_answer_is_cached_and_a_second_start_does_not_measure(
    skeleton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = choose_cpu_dtype(skeleton, cache_root=tmp_path)
    cache = json.loads((tmp_path / CACHE_FILE_NAME).read_text())
    no_measuring(monkeypatch)
    second = choose_cpu_dtype(skeleton, cache_root=tmp_path)

    assert f"cached in {tmp_path / CACHE_FILE_NAME}" in first.reason
    (entry,) = cache["entries"]
    assert entry["key"]["threads"] == torch.get_num_threads()
    assert entry["key"]["torch"] == torch.__version__
    assert second.cached and "earlier start" in second.reason
    assert (second.dtype, second.float32_seconds, second.bfloat16_seconds) == (
        first.dtype,
        first.float32_seconds,
        first.bfloat16_seconds,
    )


def test_another_thread_count_is_measured_again(
    skeleton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_timings(monkeypatch, 1.0, 0.5)
    choose_cpu_dtype(skeleton, cache_root=tmp_path)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    choose_cpu_dtype(skeleton, cache_root=tmp_path)

    assert len(calls) == 2
    assert len(json.loads((tmp_path / CACHE_FILE_NAME).read_text())["entries"]) == 2


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '["a list"]',
        '{"format": 1, "entries": "none"}',
        '{"format": 1, "entries": [{"key": 1, "float32_seconds": -1}]}',
    ],
)
def test_a_corrupt_cache_is_measured_again_and_replaced(
    content: str, skeleton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / CACHE_FILE_NAME).write_text(content)
    calls = fake_timings(monkeypatch, 1.0, 0.5)

    choice = choose_cpu_dtype(skeleton, cache_root=tmp_path)

    assert calls and not choice.cached and choice.dtype == torch.bfloat16
    assert json.loads((tmp_path / CACHE_FILE_NAME).read_text())["format"] == 1


def test_an_unwritable_cache_still_gives_an_answer(
    skeleton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    fake_timings(monkeypatch, 1.0, 1.5)

    choice = choose_cpu_dtype(skeleton, cache_root=tmp_path / "a-file" / "cache")

    assert choice.dtype == torch.float32
    assert "cached in" not in choice.reason


def test_a_busy_machine_keeps_the_rule_unmeasured_and_uncached(
    skeleton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_timings(monkeypatch, 1.0, 1.5)
    monkeypatch.setattr(_dtype_probe, "busy_reason", lambda: "load average 9.0 on 2 CPUs")
    busy = choose_cpu_dtype(skeleton, cache_root=tmp_path, rule=torch.bfloat16)
    monkeypatch.setattr(_dtype_probe, "busy_reason", lambda: None)
    quiet = choose_cpu_dtype(skeleton, cache_root=tmp_path)

    assert busy.dtype == torch.bfloat16 and not busy.cached
    assert busy.reason == "the rule (not measured: the machine is busy, load average 9.0 on 2 CPUs)"
    assert quiet.dtype == torch.float32 and not quiet.cached
    assert len(calls) == 1


def test_a_cached_answer_serves_a_busy_machine(
    skeleton, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_timings(monkeypatch, 1.0, 1.5)
    choose_cpu_dtype(skeleton, cache_root=tmp_path)
    monkeypatch.setattr(_dtype_probe, "busy_reason", lambda: "load average 9.0 on 2 CPUs")
    no_measuring(monkeypatch)

    busy = choose_cpu_dtype(skeleton, cache_root=tmp_path, rule=torch.bfloat16)

    assert busy.cached and busy.dtype == torch.float32


# --- load_model ------------------------------------------------------------------------------


def test_auto_on_a_cpu_loads_in_the_measured_dtype(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), dtype="auto", device="cpu")

    assert {p.dtype for p in loaded.model.parameters()} == {loaded.dtype}
    assert loaded.dtype_reason


@pytest.mark.parametrize(
    ("bfloat16_seconds", "expected"), [(0.5, torch.bfloat16), (1.3, torch.float32)]
)
def test_auto_follows_the_measurement_where_the_rule_says_bf16(
    bfloat16_seconds: float,
    expected: torch.dtype,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_loading, "cpu_supports_bf16", lambda: True)
    calls = fake_timings(monkeypatch, 1.0, bfloat16_seconds)

    loaded = load_model(str(tiny_model_dir), dtype="auto", device="cpu")

    assert calls and loaded.dtype == expected
    assert {p.dtype for p in loaded.model.parameters()} == {expected}
    assert "at this model's shapes" in loaded.dtype_reason
    # Loaded in that dtype, as dtype="bfloat16" would: RoPE's frequencies stay float32.
    assert loaded.model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_auto_without_native_bf16_is_float32_unmeasured(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loading, "cpu_supports_bf16", lambda: False)
    no_measuring(monkeypatch)

    loaded = load_model(str(tiny_model_dir), dtype="auto", device="cpu")

    assert loaded.dtype == torch.float32
    assert "no native bf16" in loaded.dtype_reason


def test_art_dtype_probe_0_keeps_the_rule(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loading, "cpu_supports_bf16", lambda: True)
    monkeypatch.setenv("ART_DTYPE_PROBE", "0")
    no_measuring(monkeypatch)

    loaded = load_model(str(tiny_model_dir), dtype="auto", device="cpu")

    assert loaded.dtype == torch.bfloat16
    assert "ART_DTYPE_PROBE=0" in loaded.dtype_reason


@pytest.mark.parametrize(
    ("name", "expected"), [("float32", torch.float32), ("bfloat16", torch.bfloat16)]
)
def test_an_explicit_dtype_is_not_measured(
    name: str, expected: torch.dtype, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loading, "cpu_supports_bf16", lambda: True)
    no_measuring(monkeypatch)

    loaded = load_model(str(tiny_model_dir), dtype=name, device="cpu")

    assert loaded.dtype == expected
    assert loaded.dtype_reason == "asked for"


def test_the_choice_is_logged_at_start_up(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_loading, "cpu_supports_bf16", lambda: True)
    fake_timings(monkeypatch, 1.0, 1.21)

    with caplog.at_level("INFO", logger="art_backend.loading"):
        load_model(str(tiny_model_dir), dtype="auto", device="cpu")

    assert any(
        r.getMessage().startswith("dtype auto -> float32: bf16 linears 1.21x slower")
        for r in caplog.records
    )
