"""The cookbook-shaped loops of examples/ (tinker_rl_loop.py, tinker_sl_loop.py) run end to end
through the SDK against a real server, shrunk onto the tiny model (on SmolLM2 by hand: the
numbers are in BENCHMARKS.md). The tiny model is random, so the RL test rewards every other
sample: each group has a spread, and every batch trains."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)

from tests.support.servers import RunningServer, running_server  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
API_KEY = "tml-examples-key"


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_server(
        tiny_model_dir, tmp_path_factory.mktemp("art-examples"), api_key=API_KEY
    ) as running:
        yield running


def example(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def shrunk(module: ModuleType, server: RunningServer, *extra: str):
    return module.parse_args(
        ["--base-url", server.url, "--model-name", "tiny", "--eval-samples", "1", *extra]
    )


def test_the_reward_gives_partial_credit(monkeypatch: pytest.MonkeyPatch):
    loop = example("tinker_rl_loop", monkeypatch)
    assert loop.get_reward("12", 12) == 1.0
    assert loop.get_reward(" 12.", 12) == 1.0
    assert loop.get_reward("7 + 5 is 12.", 12) == 0.5
    assert loop.get_reward("12 is 7 + 5", 12) == 0.0
    assert loop.get_reward("13", 12) == 0.2
    assert loop.get_reward("no idea", 12) == 0.0


def test_the_rl_loop_trains_every_batch(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, capsys
):
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    loop = example("tinker_rl_loop", monkeypatch)
    flips = itertools.cycle([0.0, 1.0])
    monkeypatch.setattr(loop, "get_reward", lambda response, answer: next(flips))
    args = shrunk(loop, server, "--batches", "2", "--batch-size", "2", "--group-size", "2")
    args.max_tokens = 4
    result = loop.main(args)
    assert set(result) == {"before", "after"}
    output = capsys.readouterr().out
    assert "batch 2/2" in output and ", 4 datums," in output
    assert "held-out reward after" in output


def test_the_sl_loop_trains_and_its_loss_falls(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, capsys
):
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    loop = example("tinker_sl_loop", monkeypatch)
    # One batch of the same four rows, three times: the loss on them must fall.
    args = shrunk(loop, server, "--batches", "3", "--batch-size", "4")
    rows = [{"question": f"What is {a} + 2?", "answer": a + 2} for a in range(1, 5)]
    monkeypatch.setattr(loop, "load", lambda path: rows)
    loop.main(args)
    output = capsys.readouterr().out
    losses = [float(line.rsplit(" ", 1)[1]) for line in output.splitlines() if ": loss " in line]
    assert len(losses) == 3 and losses[-1] < losses[0]
