"""An idle torch engine's admission window (`engines/_admission.py`): a burst of requests is
prefilled together, and a window that is not a number of milliseconds is refused by name."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from art_backend._errors import ModelLoadError
from art_backend.engines._admission import DEFAULT_MS, VARIABLE, admit_window
from art_backend.engines._engine import FinishEvent
from tests.server.engines.test_engine import (
    greedy,
    started_engine,
    tokenizer,  # noqa: F401 (a fixture)
)


@pytest.mark.parametrize(
    ("value", "seconds"), [("", DEFAULT_MS / 1e3), ("0", 0.0), (" 12.5 ", 0.0125), ("1000", 1.0)]
)
def test_the_window_is_read_in_milliseconds(monkeypatch, value: str, seconds: float):
    monkeypatch.setenv(VARIABLE, value)
    assert admit_window() == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["soon", "-1", "1000.5", "nan", "inf"])
def test_a_window_that_is_not_milliseconds_is_refused_by_name(monkeypatch, value: str):
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ModelLoadError, match=f"{VARIABLE}=.*from 0 to 1000"):
        admit_window()


async def finished(events: asyncio.Queue) -> FinishEvent:
    while not isinstance(event := await events.get(), FinishEvent):
        pass
    return event


async def test_a_request_arriving_within_the_window_is_prefilled_with_the_first(
    tiny_model_dir: Path,
    tokenizer,  # noqa: F811 (the fixture)
    monkeypatch,
):
    # A long window, so that the second request comes within it however slow the machine; with
    # the batch's two rows taken the engine stops waiting at once.
    monkeypatch.setenv(VARIABLE, "1000")
    engine = started_engine(tiny_model_dir, tokenizer, max_batch_size=2)
    try:
        first = engine.submit(greedy([5, 6, 7, 8, 9], 4))
        deadline = time.monotonic() + 30
        while not engine._pending.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)  # until the engine has taken the first (and waits)
        assert engine._pending.empty()
        second = engine.submit(greedy([9, 8, 7, 6, 5], 4))
        results = await asyncio.gather(finished(first), finished(second))
    finally:
        engine.stop()
    # Without the window the first is prefilled alone and the second after it: 2 prefills.
    assert engine.metrics.prefill_batches_total == 1
    assert [len(result.token_ids) for result in results] == [4, 4]
